"""`import verl` alone (no import of rpg) must register every RPG name in every process: verl loads the
`verl.plugins` entry point and swallows its errors, so this is the test that catches a broken plugin. Every import
order registers every name, with no import hook (the plugin imports no rpg module that imports verl). Each of these
six checks runs in a process of its own where verl and rpg were never imported, all forked from one interpreter that
preloaded verl's third-party libraries (`fresh_process`), built once for the module (the `fresh` fixture)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import fresh_process
import pytest

PLUGIN = Path(__file__).resolve().parents[1] / "rpg" / "verl_plugin.py"

EXPECTED_LOSSES = sorted(
    [f"rpg_{d}" for d in ("fkl", "rkl", "ufkl", "urkl")]
    + [f"rpg_reinforce_{d}" for d in ("fkl", "rkl", "ufkl", "urkl")]
    + [f"rpg_reinforce_hardclip_{d}" for d in ("fkl", "rkl", "ufkl", "urkl")]
    + [f"rpg_kl_{d}" for d in ("fkl", "rkl", "ufkl", "urkl")]
    + ["grpo_wk3"]
)

PROBE = """
import json, sys
import verl
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as A, POLICY_LOSS_REGISTRY as R
print(json.dumps({"losses": sorted(k for k in R if k.startswith("rpg") or k == "grpo_wk3"),
                  "adv": sorted(k for k in A if k.startswith("rpg")),
                  "rpg_imported_before_verl_finished": "rpg.verl_plugin" in sys.modules}))
"""


def test_plain_import_verl_registers_everything(fresh):
    out = fresh["plain"]
    out.check_returncode()
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["losses"] == EXPECTED_LOSSES
    assert got["adv"] == ["rpg", "rpg_batchmean"]
    assert got["rpg_imported_before_verl_finished"]


INSTALLED = """
from rpg import install
print(json.dumps({"installed": [n for n in install.NAMES if install.installed(n)]}))
"""


def _plugin_imports() -> list[str]:
    """The rpg modules rpg/verl_plugin.py imports at module level."""
    tree = ast.parse(PLUGIN.read_text())
    modules = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module.startswith("rpg.")]
    modules += [f"rpg.{a.name}" for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "rpg" for a in n.names]
    assert {"rpg.install", "rpg.loss_table", "rpg.advantages"} <= set(modules), modules
    return modules


# `import rpg` first, then every rpg module the plugin imports, with verl blocked: none of them imports verl, which is
# what lets verl load the plugin while any rpg module is half-initialised; then verl is unblocked.
LIGHT = "import sys; sys.modules['verl'] = None\nimport rpg\n" + "".join(f"import {m}\n" for m in _plugin_imports()) + (
    "assert not [m for m in sys.modules if m.startswith('verl.')]; del sys.modules['verl']\n"
)


FIRSTS = ["rpg.loss_config", "rpg.losses", "rpg.advantages", "rpg.schedule_free_worker", "rpg"]


def _import_order(first: str) -> tuple[str, list[str], dict[str, str]]:
    """`PROBE` after importing `first`, in a fresh process's environment: without what an earlier in-process test
    of this worker may have left (the CPU platform's variables, RPG_INSTALL), as tests/test_scoped_patches_on_cpu.py
    does; `rpg.schedule_free_worker` first with `RPG_INSTALL` naming schedule_free and the reference adapter."""
    drop = ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM", "VERL_ENGINE_DEVICE", "RPG_INSTALL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if first == "rpg.schedule_free_worker":
        env["RPG_INSTALL"] = "ref_log_prob,schedule_free"
    return (LIGHT if first == "rpg" else f"import {first}\n") + PROBE + INSTALLED, [], env


@pytest.fixture(scope="module")
def fresh() -> dict[str, subprocess.CompletedProcess]:
    """The module's fresh-process checks: `PROBE` in the test process's environment, and each import order."""
    return fresh_process.run({"plain": (PROBE, [], dict(os.environ)), **{f: _import_order(f) for f in FIRSTS}})


@pytest.mark.parametrize("first", FIRSTS)
def test_any_import_order_registers_everything(fresh, first):
    """Importing an rpg module before verl must not break verl's plugin loading (a half-initialised module).
    `rpg` first: with the plugin's own rpg imports, verl blocked (`LIGHT`). `rpg.schedule_free_worker` first, as a Ray
    worker of a schedule-free run unpickles its worker class, with `RPG_INSTALL` naming schedule_free and the reference
    adapter: both are installed while the worker module is half-initialised (the trainer lives apart from it, in
    rpg.schedule_free_trainer), and the plugin reports no error."""
    out = fresh[first]
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    got = {**json.loads(lines[-2]), **json.loads(lines[-1])}
    assert got["losses"] == EXPECTED_LOSSES and got["adv"] == ["rpg", "rpg_batchmean"]
    assert got["installed"] == (["ref_log_prob", "schedule_free"] if first == "rpg.schedule_free_worker" else [])
    assert "[rpg] error" not in out.stderr


def test_registration_is_idempotent():
    import importlib

    import rpg.verl_plugin as plugin
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    before = {k: POLICY_LOSS_REGISTRY[k] for k in EXPECTED_LOSSES}
    importlib.reload(plugin)
    assert plugin.register() == plugin.REGISTERED
    assert all(POLICY_LOSS_REGISTRY[k] is before[k] for k in EXPECTED_LOSSES)


def test_hydra_target_resolves_to_the_config_class():
    from hydra.utils import get_class

    import rpg

    assert get_class("rpg.RPGPolicyLossConfig") is rpg.RPGPolicyLossConfig
