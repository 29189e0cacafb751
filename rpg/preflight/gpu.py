"""GPU launch checks, for a GPU run only (`trainer.device` is not `cpu`; the CPU profile sets it):

* the per-GPU memory plan (`rpg.preflight.memory`, docs/gpu.md#memory-plan): exactly one line on stderr, the plan
  (`[rpg] GPU memory plan (per GPU, <model>, budget B GiB): rollout R GiB, update U GiB`) or why none was made (the
  model's config.json is neither on disk, in the Hugging Face cache nor in the shipped table); a phase over budget
  is an error, in a dry run and at launch, naming the phase, the numbers and the settings that would fit;
* what a local launch (no RAY_ADDRESS) needs on this node before Ray starts (`runtime_problems`): vLLM for
  `rollout.name=vllm`, flash-attn for verl's default `attn_implementation=flash_attention_2`, and at least
  `trainer.n_gpus_per_node` GPUs. A real launch refuses a missing one; a dry run prints them as warnings.

verl 0.9.1 needs flash-attn only through the attention implementation: `HFModelConfig` loads the model with
`override_config.attn_implementation` (default `flash_attention_2`, which transformers refuses without the package);
`use_remove_padding`'s pad/unpad helpers and the cross-entropy kernel fall back to PyTorch without it.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Callable, Optional

from omegaconf import DictConfig

from rpg.preflight.compose import RecipeConfigError

FLASH_ATTN_INSTALL = "pip install ninja packaging && MAX_JOBS=8 pip install --no-build-isolation flash-attn==2.8.3"


def is_gpu_run(config: DictConfig) -> bool:
    return str(config.trainer.get("device", "cuda")) != "cpu"


def check_memory_plan(config: DictConfig, budget_gib: Optional[float] = None, out=None):
    """Print the plan line (or why there is none) on `out` (stderr); raise RecipeConfigError if a phase is over budget.

    Returns the `MemoryPlan`, or None when the model's shape is unknown or the engine is not estimated."""
    from rpg.preflight.memory import budget_from_env, memory_plan

    out = out or sys.stderr
    try:
        budget = budget_from_env() if budget_gib is None else float(budget_gib)
    except ValueError as e:  # a bad GPU_MEMORY_GIB
        raise RecipeConfigError(str(e)) from None
    try:
        plan = memory_plan(config, budget_gib=budget)
    except ValueError as e:  # no config.json for the model, or an engine the plan does not cover
        print(f"[rpg] GPU memory plan: not computed: {e}", file=out)
        return None
    print(plan.line(), file=out)
    problems = plan.problems()
    if problems:
        raise RecipeConfigError("GPU memory plan over budget (docs/gpu.md#memory-plan):\n- " + "\n- ".join(problems))
    return plan


def _device_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 -- no torch or no driver: no GPU
        return 0


def runtime_problems(
    config: DictConfig,
    find_spec: Optional[Callable[[str], object]] = None,
    device_count: Optional[Callable[[], int]] = None,
) -> list[str]:
    """What this node lacks to run `config` locally: engines that cannot be imported, fewer GPUs than asked for.
    `find_spec` (default importlib.util.find_spec) and `device_count` (default torch.cuda.device_count): for tests."""
    find_spec, device_count = find_spec or importlib.util.find_spec, device_count or _device_count
    problems, python = [], sys.executable
    arr = config.actor_rollout_ref
    if str(arr.rollout.name) == "vllm" and find_spec("vllm") is None:
        problems.append(
            f"actor_rollout_ref.rollout.name=vllm, but vllm cannot be imported by {python}. Fix: install the GPU "
            f"requirements in this environment (pip install -r requirements-gpu.txt, docs/gpu.md#install), or set "
            f"PYTHON to the interpreter that has them"
        )
    attn = (arr.model.get("override_config", None) or {}).get("attn_implementation", "flash_attention_2")
    if attn == "flash_attention_2" and find_spec("flash_attn") is None:
        problems.append(
            f"actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2 (verl's default) needs "
            f"flash-attn, which {python} cannot import. Fix: {FLASH_ATTN_INSTALL} (docs/gpu.md#install)"
        )
    need, have = int(config.trainer.n_gpus_per_node), device_count()
    if have < need:
        seen = f"{have} GPU(s)" if have else "no GPU"
        fix = f"N_GPUS={have}" if have else "run on a GPU node (or RPG_PROFILE=cpu for the CPU profile)"
        problems.append(
            f"trainer.n_gpus_per_node={need} (recipe knob N_GPUS), but torch sees {seen} on this node "
            f"(torch.cuda.device_count()). Fix: {fix}"
        )
    return problems


def check_gpu_launch(config: DictConfig, *, dry_run: bool, local: bool, out=None) -> None:
    """The GPU checks of `rpg.launch.run` (nothing for a CPU run): the memory plan, then, for a local launch or any
    dry run, what the node lacks (an error at launch, a warning in a dry run)."""
    if not is_gpu_run(config):
        return
    out = out or sys.stderr
    check_memory_plan(config, out=out)
    if not (dry_run or local):
        return
    problems = runtime_problems(config)
    if dry_run:
        for problem in problems:
            print(f"[rpg] dry run: a local launch would refuse: {problem}", file=out)
    elif problems:
        raise RecipeConfigError("this node cannot run the config:\n- " + "\n- ".join(problems))
