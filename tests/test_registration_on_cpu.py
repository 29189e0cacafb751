"""`import verl` alone (no import of rpg) must register every RPG name in every process: verl loads the
`verl.plugins` entry point and swallows its errors, so this is the test that catches a broken plugin."""

from __future__ import annotations

import json
import subprocess
import sys

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


def test_plain_import_verl_registers_everything():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["losses"] == EXPECTED_LOSSES
    assert got["adv"] == ["rpg", "rpg_batchmean"]
    assert got["rpg_imported_before_verl_finished"]


import pytest


@pytest.mark.parametrize("first", ["rpg.loss_config", "rpg.losses", "rpg.advantages", "rpg.divergences", "rpg"])
def test_any_import_order_registers_everything(first):
    """Importing an rpg module before verl must not break verl's plugin loading (a half-initialised module)."""
    probe = f"import {first}\n" + PROBE
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["losses"] == EXPECTED_LOSSES and got["adv"] == ["rpg", "rpg_batchmean"]


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
