"""Helpers for the recipe tests: run a recipe script in the launcher's print mode (no Python start) and
compose + validate its overrides in-process with `rpg.launch.compose_and_validate`. (Imported by the test modules of
this folder, which pytest puts on sys.path.)"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipe" / "rpg"
SCRIPTS_7B = sorted((RECIPE / "7b").glob("*.sh"))
SCRIPTS_4B = sorted((RECIPE / "4b").glob("*.sh"))
SCRIPTS_CPU = sorted((RECIPE / "cpu").glob("run_*.sh"))

# Environment knobs a developer may have exported; the tests must see the scripts' own defaults.
_KNOBS = (
    "MODEL_PATH TRAIN_FILE TEST_FILE CKPTS_DIR DATA_DIR NNODES N_GPUS PROJECT_NAME EXP_NAME RAY_ADDRESS RPG_DRY_RUN "
    "RPG_PROFILE OPTIM THINKING CPU_SEED PYTHON RPG_PRINT_ARGV RPG_OPTIM_DIR VERL_USE_EXTERNAL_MODULES CPU_RANKS "
    "RPG_RAY_FOLLOW RPG_RAY_JOB_ID RPG_JOB_ENV CPU_ROLLOUT CPU_DTYPE SMOKE RPG_SMOKE_DIR GPU_MEMORY_GIB RPG_SHARED_CKPT "
    "VERL_PLATFORM VERL_ENGINE_DEVICE"  # in-process CPU-engine tests of this session set the last two
).split()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _KNOBS}
    env.update(extra)
    return env


def run_script(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args], env=clean_env(**env), capture_output=True, text=True, timeout=60, cwd=REPO
    )


@functools.lru_cache(maxsize=None)
def printed(script: Path) -> dict:
    """The launcher's final argv/env as JSON (RPG_PRINT_ARGV=1); fails the test if the script errors."""
    proc = run_script(script, RPG_PRINT_ARGV="1", RPG_DRY_RUN="1")
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stderr}"
    return json.loads(proc.stdout)


def overrides(script: Path) -> list[str]:
    argv = printed(script)["argv"]
    assert argv[1:3] == ["-m", "rpg.launch"], argv[:3]
    return argv[3:]


@functools.lru_cache(maxsize=None)
def validated(script: Path):
    """`compose_and_validate` of the script's overrides (cached: each script is composed once per session)."""
    from rpg.launch import compose_and_validate

    return compose_and_validate(overrides(script))


def cfg_with(base, **updates):
    """A copy of the composed config `base` with dotted keys (`__` stands for `.`) set; new keys are allowed."""
    import copy

    from omegaconf import OmegaConf, open_dict

    cfg = copy.deepcopy(base)
    with open_dict(cfg):
        for key, value in updates.items():
            OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    return cfg
