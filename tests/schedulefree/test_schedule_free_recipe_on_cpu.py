"""recipe/rpg/optim/schedulefree.sh through the real launcher: every `*_schedulefree*` script selects schedule-free
AdamW + the `schedule_free_sync` trainer, imports `rpg.schedule_free` in every process, composes and validates, and
one script passes a full `RPG_DRY_RUN=1` (a fresh Python that imports the module through verl's
VERL_USE_EXTERNAL_MODULES, as every Ray process will)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rpg.schedule_free as sfm

REPO = Path(__file__).resolve().parents[2]
SF_SCRIPTS = sorted(p for p in (REPO / "recipe" / "rpg").glob("*/run_*.sh") if "schedulefree" in p.name)
KNOBS = ("MODEL_PATH TRAIN_FILE TEST_FILE CKPTS_DIR DATA_DIR NNODES N_GPUS PROJECT_NAME EXP_NAME RAY_ADDRESS "
         "RPG_DRY_RUN RPG_PROFILE OPTIM PYTHON RPG_PRINT_ARGV RPG_OPTIM_DIR VERL_USE_EXTERNAL_MODULES "
         "VERL_PLATFORM VERL_ENGINE_DEVICE").split()  # the last two are set by in-process CPU-engine tests
EXPECTED = [
    "actor_rollout_ref.actor.optim.optimizer_impl=schedulefree",
    "actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFree",
    "trainer.use_v1=True",
    f"trainer.v1.trainer_mode={sfm.TRAINER_MODE}",
]


def _run(script: Path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in KNOBS} | env
    return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=300, cwd=REPO)


def _printed(script: Path) -> dict:
    proc = _run(script, RPG_PRINT_ARGV="1")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_authors_schedule_free_scripts_exist():
    assert len([p for p in SF_SCRIPTS if p.parent.name == "7b"]) == 30  # 30 of docs/differences.md#authors-scripts


@pytest.mark.parametrize("script", SF_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_schedule_free_script_selects_optimizer_trainer_and_module(script):
    from rpg.launch import compose_and_validate

    printed = _printed(script)
    argv = printed["argv"]
    assert argv[1:3] == ["-m", "rpg.launch"]
    for override in EXPECTED:
        assert override in argv
    # nothing after the optimizer block switches back to AdamW or to another trainer
    last = {a.split("=", 1)[0]: a for a in argv[3:]}
    assert all(last[o.split("=", 1)[0]] == o for o in EXPECTED)
    assert "rpg.schedule_free" in printed["env"]["VERL_USE_EXTERNAL_MODULES"].split(",")
    validated = compose_and_validate(argv[3:])
    assert sfm.check_config(validated.config) is True
    optim = validated.actor.optim
    assert (optim.weight_decay, tuple(optim.betas), optim.lr_warmup_steps, optim.lr_scheduler_type) == (
        0.1, (0.9, 0.999), 10, "constant")


def test_dry_run_imports_the_module_in_a_fresh_process():
    script = REPO / "recipe" / "rpg" / "7b" / "run_rpg_7b_urkl1e-4_schedulefree.sh"
    proc = _run(script, RPG_DRY_RUN="1", PYTHON=sys.executable)  # GPU scripts run python3 unless PYTHON is set
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"trainer_mode: {sfm.TRAINER_MODE}" in proc.stdout
    assert "optimizer: AdamWScheduleFree" in proc.stdout
