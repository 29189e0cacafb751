"""CPU_ROLLOUT (hf | vllm) and CPU_DTYPE (fp32 | bf16) of the CPU profile (rpg/config/profile/cpu.yaml and the
launcher's `cpu_profile`, rpg/preflight/recipe_argv.py), in the
launcher's print mode (no verl import): the overrides, the interpreter and the modules every process
imports; bad values and a missing .venv-vllm fail early with the fix."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_helpers import RECIPE, clean_env, run_script

URKL = RECIPE / "cpu" / "run_rpg_reinforce_urkl.sh"
FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"


@pytest.fixture
def vllm_venv(tmp_path: Path) -> Path:
    """A stand-in .venv-vllm folder whose bin/python is this test's interpreter (print mode runs only the launcher's
    standard-library `python -m rpg.preflight.recipe_argv` with it)."""
    exe = tmp_path / "venv-vllm" / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe.parents[1]


def printed(**env: str) -> dict:
    proc = run_script(URKL, RPG_PRINT_ARGV="1", **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def last(argv: list[str], key: str) -> str | None:
    values = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].lstrip("+") == key]
    return values[-1] if values else None


def test_default_is_the_hf_rollout_in_fp32():
    data = printed()
    argv, modules = data["argv"], data["env"]["VERL_USE_EXTERNAL_MODULES"]
    assert last(argv, "actor_rollout_ref.rollout.name") is None  # the profile's own backend:
    from omegaconf import OmegaConf

    assert OmegaConf.load(RECIPE.parents[1] / "rpg/config/profile/cpu.yaml").actor_rollout_ref.rollout.name == "hf"
    assert last(argv, "actor_rollout_ref.actor.fsdp_config.mixed_precision") == FP32
    assert modules == "rpg.cpu.platform,rpg.cpu.hf_rollout,rpg.verl_plugin"
    assert last(argv, "actor_rollout_ref.rollout.enable_sleep_mode") is None
    assert argv[0].endswith(".venv/bin/python") or argv[0] == "python3"


def test_vllm_selects_verls_rollout_its_environment_and_the_patches(vllm_venv: Path):
    data = printed(CPU_ROLLOUT="vllm", RPG_VLLM_VENV=str(vllm_venv))
    argv = data["argv"]
    assert argv[0] == str(vllm_venv / "bin" / "python")
    assert data["env"]["VERL_USE_EXTERNAL_MODULES"] == "rpg.cpu.vllm_compat,rpg.cpu.platform,rpg.verl_plugin"
    assert last(argv, "actor_rollout_ref.rollout.name") == "vllm"
    assert last(argv, "actor_rollout_ref.rollout.enable_sleep_mode") == "False"
    assert "+actor_rollout_ref.rollout.enable_sleep_mode=False" in argv  # not in verl's rollout.yaml: needs '+'
    assert last(argv, "actor_rollout_ref.rollout.dtype") == "float32"  # = the actor's fp32
    assert last(argv, "actor_rollout_ref.actor.fsdp_config.mixed_precision") == FP32


def test_vllm_keeps_an_explicit_python_and_orders_extra_modules_after_the_patches(vllm_venv: Path):
    python = str(vllm_venv / "bin" / "python")  # anywhere but .venv-vllm (RPG_VLLM_VENV is not set)
    data = printed(CPU_ROLLOUT="vllm", PYTHON=python, VERL_USE_EXTERNAL_MODULES="my.module")
    assert data["argv"][0] == python
    assert data["env"]["VERL_USE_EXTERNAL_MODULES"] == \
        "rpg.cpu.vllm_compat,rpg.cpu.platform,my.module,rpg.verl_plugin"  # fmt: skip


def test_bf16_is_verls_default_mixed_precision_and_a_bf16_vllm(vllm_venv: Path):
    argv = printed(CPU_ROLLOUT="vllm", CPU_DTYPE="bf16", RPG_VLLM_VENV=str(vllm_venv))["argv"]
    assert last(argv, "actor_rollout_ref.actor.fsdp_config.mixed_precision") is None  # verl: bf16 params/compute
    assert last(argv, "actor_rollout_ref.ref.fsdp_config.mixed_precision") is None
    assert last(argv, "actor_rollout_ref.rollout.dtype") == "bfloat16"


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"CPU_ROLLOUT": "sglang"}, "CPU_ROLLOUT='sglang' is not valid; choose one of: hf vllm"),
        ({"CPU_DTYPE": "fp16"}, "CPU_DTYPE='fp16' is not valid; choose one of: fp32 bf16"),
        ({"CPU_ROLLOUT": "vllm", "RPG_VLLM_VENV": "/nonexistent"}, "bash scripts/setup_env.sh --vllm"),
        ({"CPU_ROLLOUT": "vllm", "PYTHON": "python3", "VERL_USE_EXTERNAL_MODULES": "rpg.cpu.platform"},
         "needs rpg.cpu.vllm_compat first in VERL_USE_EXTERNAL_MODULES"),
    ],
)
def test_bad_values_fail_early_with_the_fix(env: dict, needle: str):
    proc = run_script(URKL, RPG_PRINT_ARGV="1", **env)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_no_module_of_the_gpu_or_hf_path_imports_the_vllm_patches():
    """rpg.cpu.vllm_compat is loaded only through VERL_USE_EXTERNAL_MODULES with CPU_ROLLOUT=vllm."""
    probe = ("import sys, rpg, rpg.verl_plugin, rpg.launch, rpg.reference, rpg.schedule_free, rpg.cpu.platform, "
             "rpg.cpu.hf_rollout, rpg.cpu.sampler; print(sorted(m for m in sys.modules if 'vllm_compat' in m))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=clean_env())
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"
