"""The built wheel, installed non-editable, registers everything: `pip wheel` of the package, installed into a fresh
virtualenv that sees this environment's dependencies but not its editable install of rpg-verl; then, in that
interpreter, a plain `import verl` registers every RPG name, rpg_trainer.yaml and every config group are shipped and
compose, and the console
scripts exist and run. (About a minute: one wheel build, one venv, one verl import.)"""

from __future__ import annotations

import json
import shutil
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from test_registration_on_cpu import EXPECTED_LOSSES

REPO = Path(__file__).resolve().parents[1]
CONSOLE_SCRIPTS = ("rpg-prepare-data", "rpg-report", "rpg-tiny-model", "rpg-prepare-model", "rpg-evaluate")

PROBE = textwrap.dedent(
    """
    import json, sys
    import importlib.metadata as md
    import verl  # the verl.plugins entry point of the installed wheel registers the RPG names
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as A, POLICY_LOSS_REGISTRY as R
    registered = {"losses": sorted(k for k in R if k.startswith("rpg") or k == "grpo_wk3"),
                  "adv": sorted(k for k in A if k.startswith("rpg"))}
    import rpg
    from rpg.launch import CONFIG_DIR, compose_and_validate
    (dist,) = [d for d in md.distributions() if d.metadata["Name"] == "rpg-verl"]
    cfg = compose_and_validate([  # a recipe of the shipped config groups
        "setup=qwen3_4b_4k", "method=rpg_reinforce", "recipe.divergence=urkl", "recipe.beta=1e-4",
    ]).config
    scripts = {ep.name: ep.load().__module__ for ep in dist.entry_points if ep.group == "console_scripts"}
    print(json.dumps({
        **registered, "rpg_file": rpg.__file__, "config_dir": str(CONFIG_DIR), "scripts": scripts,
        "plugin": [ep.value for ep in dist.entry_points if ep.group == "verl.plugins"],
        "files": sorted(str(f) for f in dist.files if f.suffix == ".yaml"),
        "n": cfg.actor_rollout_ref.rollout.n, "reward_manager": cfg.reward.reward_manager.name,
        "loss": [cfg.actor_rollout_ref.actor.policy_loss.loss_mode, cfg.data.max_response_length],
    }))
    """
)


def _fresh_env() -> dict[str, str]:
    """This process's environment without what other tests in the session set for their in-process verl workers
    (VERL_PLATFORM=cpu and friends) and without PYTHONPATH (a checkout on it would shadow the installed wheel): a
    fresh install must not depend on them."""
    return {k: v for k, v in os.environ.items() if not k.startswith("VERL_") and k != "PYTHONPATH"}


def _run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("env", _fresh_env())
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_wheel_installs_and_registers_everything(tmp_path):
    # 1. the wheel, built from a copy of the sources (setuptools writes build/ and *.egg-info next to them)
    src = tmp_path / "src"
    shutil.copytree(REPO / "rpg", src / "rpg", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist"])
    (wheel,) = (tmp_path / "dist").glob("rpg_verl-*.whl")

    # 2. a fresh venv that sees this environment's packages through a .pth, except rpg-verl's editable install
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if not entry.name.startswith(("rpg_verl", "__editable__", "rpg")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    (site / "deps.pth").write_text(f"{deps}\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel])

    # 3. everything from the installed wheel, in its own interpreter (started outside the repository)
    got = json.loads(_run([python, "-c", PROBE], cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert (got["losses"], got["adv"]) == (EXPECTED_LOSSES, ["rpg", "rpg_batchmean"])
    assert Path(got["rpg_file"]).is_relative_to(site) and Path(got["config_dir"]).is_relative_to(site)
    shipped = sorted(str(p.relative_to(REPO)) for p in (REPO / "rpg" / "config").rglob("*.yaml"))
    assert len(shipped) > 1 and {Path(f).parent.name for f in shipped} >= {"setup", "method", "optim", "profile"}
    assert got["plugin"] == ["rpg.verl_plugin"] and got["files"] == shipped  # every config group folder
    assert (got["n"], got["reward_manager"]) == (16, "dapo")  # rpg_trainer.yaml over verl's ppo_trainer
    assert got["loss"] == ["rpg_reinforce_urkl", 4096]  # the groups compose from the installed wheel
    assert got["scripts"] == {
        "rpg-prepare-data": "rpg.tools.prepare_data", "rpg-report": "rpg.tools.report",
        "rpg-tiny-model": "rpg.tools.tiny_model", "rpg-evaluate": "rpg.tools.evaluate",
        "rpg-doctor": "rpg.preflight.doctor", "rpg-prepare-model": "rpg.tools.prepare_model",
    }  # fmt: skip
    for script in CONSOLE_SCRIPTS:
        assert (venv / "bin" / script).is_file()
    usage = _run([venv / "bin" / "rpg-report", "--help"], cwd=tmp_path).stdout
    assert usage.startswith("usage: rpg-report")
