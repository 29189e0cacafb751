"""The launcher's LoRA rules (docs/reference-modes.md#lora, docs/gpu.md#lora): the adapter rank vLLM can serve, checked
by RPG so that a dry run works on a machine without vLLM, and LoRA refused with the disaggregated asynchronous trainer.

* **The rank.** verl's ``validate_config`` (verl/utils/config.py:205-215, verl 0.9.1) checks a LoRA rank that reaches
  vLLM (``rollout.name=vllm``, ``lora.merge=False``) by importing ``get_vllm_max_lora_rank`` from verl's vLLM rollout
  package, whose ``__init__`` imports vLLM: on a machine without vLLM (a laptop's dry run) that import ends in a
  traceback before any RPG check runs. `check_lora_rank` does the same check first, with the same rule as verl's
  function: vLLM serves an adapter through a buffer of the smallest of its allowed ``max_lora_rank`` values
  (``vllm.config.lora.MaxLoRARanks``; verl's fallback list `VERL_FALLBACK_RANKS` where vLLM is not importable) that
  is at least the rank, and refuses a rank above the largest. Where vLLM is importable verl's own check runs after it
  unchanged; where it is not, `config_for_verl_check` hands verl's ``validate_config`` a copy of the config whose
  ``lora.merge`` is True, the one setting with which verl's code skips exactly that vLLM rank check and nothing else
  (tests/recipes/test_lora_rules_on_cpu.py reads verl's function and fails if it reads LoRA anywhere else), for the
  verl versions whose ``validate_config`` was read (`rpg.compat.SUPPORTED_VERL`); other versions get the config as it
  is. No verl object is patched.
* **separate_async.** With LoRA and the disaggregated asynchronous trainer (``trainer.v1.trainer_mode=separate_async``:
  the actor is verl's detached worker, the weights reach the rollout through its checkpoint engine) verl samples the
  initial policy: the adapter never reaches the rollout (verl issue #7495). `separate_async_problem` refuses it for any
  loss and any reference; ``rpg-doctor`` warns about it (`rpg.preflight.doctor`).
* **The CPU rollout.** The ``hf`` rollout of CPU runs (`rpg.cpu.hf_rollout`) receives full weights only: an unmerged
  adapter is refused before Ray with the fix ``lora.merge=True`` (`hf_rollout_problem`), not at the first weight sync.

Every LoRA setting is read through `rpg.preflight.lora_config.lora_settings`, as verl's trainer reads them.
"""

from __future__ import annotations

import copy
import importlib.util
from typing import Any, Callable, Optional, Sequence, get_args

from omegaconf import DictConfig, open_dict
from packaging.specifiers import SpecifierSet

from rpg import modes
from rpg.compat import SUPPORTED_VERL, installed_version
from rpg.cpu import HF_ROLLOUT
from rpg.preflight.compose import RecipeConfigError
from rpg.preflight.lora_config import lora_settings

__all__ = [
    "VERL_FALLBACK_RANKS",
    "check_lora_rank",
    "validate_lora",
    "config_for_verl_check",
    "lora_problems",
    "separate_async_problem",
    "vllm_lora_rank",
    "vllm_serves_adapter",
]

#: verl 0.9.1's list of vLLM's allowed ``max_lora_rank`` values where vLLM cannot be imported
#: (verl/workers/rollout/vllm_rollout/utils.py, ``get_vllm_max_lora_rank``'s fallback).
VERL_FALLBACK_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VERL_ISSUE_LORA_ASYNC = "https://github.com/volcengine/verl/issues/7495"


def vllm_importable(find_spec: Callable = importlib.util.find_spec) -> bool:
    return find_spec("vllm") is not None


def vllm_ranks(find_spec: Callable = importlib.util.find_spec) -> tuple[int, ...]:
    """vLLM's allowed ``max_lora_rank`` values, as verl reads them: vLLM's ``MaxLoRARanks`` where vLLM imports, else
    `VERL_FALLBACK_RANKS`."""
    if not vllm_importable(find_spec):
        return VERL_FALLBACK_RANKS
    try:  # deferred: vLLM is imported only where it is installed (verl's validate_config imports it there too)
        from vllm.config.lora import MaxLoRARanks
    except Exception:  # noqa: BLE001 -- as verl's function: any failure falls back to its list
        return VERL_FALLBACK_RANKS
    return tuple(sorted(get_args(MaxLoRARanks))) or VERL_FALLBACK_RANKS


def vllm_lora_rank(rank: int, ranks: Sequence[int] = VERL_FALLBACK_RANKS) -> int:
    """vLLM's ``max_lora_rank`` verl derives for an adapter of `rank`: the smallest allowed value ≥ `rank`
    (ValueError above the largest)."""
    fits = [r for r in sorted(ranks) if r >= rank]
    if rank <= 0 or not fits:
        raise ValueError(f"{rank} is not a LoRA rank vLLM serves: it must be in 1..{max(ranks)}")
    return fits[0]


def vllm_serves_adapter(config: Any) -> bool:
    """Whether the adapter itself reaches vLLM (verl's ``enable_lora``): a LoRA rank, the vLLM rollout, and the adapter
    not merged into the base weights before the sync (``lora.merge=False``)."""
    lora = lora_settings(config)
    rollout = config.actor_rollout_ref.rollout
    return lora.rank > 0 and not lora.merge and str(rollout.get("name", "")) == "vllm"


def check_lora_rank(config: Any, find_spec: Callable = importlib.util.find_spec) -> Optional[str]:
    """The refusal of a LoRA rank vLLM cannot serve (None: no LoRA reaches vLLM, or the rank fits)."""
    if not vllm_serves_adapter(config):
        return None
    lora, ranks = lora_settings(config), vllm_ranks(find_spec)
    if lora.rank <= max(ranks):
        return None
    return (f"{lora.rank_setting}={lora.rank}: vLLM serves LoRA adapters up to rank {max(ranks)} (verl derives "
            f"max_lora_rank from the allowed values {', '.join(map(str, ranks))}). Fix: a rank of at most "
            f"{max(ranks)}, or actor_rollout_ref.model.lora.merge=True (the adapter is merged into the weights vLLM "
            f"receives)")


def separate_async_problem(config: Any) -> Optional[str]:
    """The refusal of LoRA with the detached actor of ``separate_async`` (verl #7495), None otherwise."""
    mode, lora = modes.trainer_mode(config), lora_settings(config)
    if not (lora.enabled and mode.detached_actor):
        return None
    what = (f"{lora.rank_setting}={lora.rank}" if lora.rank > 0
            else f"actor_rollout_ref.model.lora_adapter_path={lora.adapter_path}")
    return (f"{what} (LoRA) with {modes.TRAINER_MODE_KEY}={mode.name} (recipe knob "
            f"TRAINER_MODE): verl's disaggregated weight sync does not carry the adapter to the rollout, which then "
            f"samples the initial policy for the whole run, silently (verl issue #7495, {VERL_ISSUE_LORA_ASYNC}). "
            f"Fix: TRAINER_MODE=colocate_async or sync, or full-weight training (lora_rank=0)")


def hf_rollout_problem(config: Any) -> Optional[str]:
    """The refusal of an unmerged adapter with the CPU ``hf`` rollout, which loads full weights only (it raises at the
    first weight sync of a started cluster otherwise), None otherwise."""
    lora, rollout = lora_settings(config), config.actor_rollout_ref.rollout
    if not lora.enabled or lora.merge or str(rollout.get("name", "")) != HF_ROLLOUT:
        return None
    return (f"{lora.rank_setting}={lora.rank} (LoRA) with actor_rollout_ref.rollout.name={HF_ROLLOUT} (the CPU "
            f"rollout, rpg/cpu/hf_rollout.py): it receives full weights only, not an adapter. Fix: "
            f"actor_rollout_ref.model.lora.merge=True (verl merges the adapter into the weights it syncs), or "
            f"CPU_ROLLOUT=vllm")


def lora_problems(config: Any, find_spec: Callable = importlib.util.find_spec) -> list[str]:
    """Every LoRA refusal of a composed config (empty: none)."""
    found = (check_lora_rank(config, find_spec), separate_async_problem(config), hf_rollout_problem(config))
    return [p for p in found if p]


def validate_lora(config: Any) -> None:
    """Raise `RecipeConfigError` listing `lora_problems` (the launcher's `validate`, before verl's checks)."""
    problems = lora_problems(config)
    if len(problems) == 1:
        raise RecipeConfigError(f"invalid LoRA configuration: {problems[0]}")
    if problems:
        raise RecipeConfigError("invalid LoRA configuration:\n- " + "\n- ".join(problems))


def verl_check_was_read() -> bool:
    """Whether this verl's ``validate_config`` is one whose LoRA lines were read (`SUPPORTED_VERL`)."""
    version = installed_version("verl")
    return version is not None and SpecifierSet(SUPPORTED_VERL).contains(version, prereleases=True)


def config_for_verl_check(config: DictConfig, find_spec: Callable = importlib.util.find_spec) -> DictConfig:
    """The config to hand verl's ``validate_config``: `config` itself, unless its LoRA adapter reaches vLLM, vLLM is
    not importable here, and verl is a version whose ``validate_config`` was read; then a copy with ``lora.merge=True``
    (verl skips its vLLM rank check, done here first: its refusal is raised as `RecipeConfigError`)."""
    if problem := check_lora_rank(config, find_spec):
        raise RecipeConfigError(problem)
    if not vllm_serves_adapter(config) or vllm_importable(find_spec) or not verl_check_was_read():
        return config
    merged = copy.deepcopy(config)
    with open_dict(merged):
        model = merged.actor_rollout_ref.model
        if model.get("lora") is None:
            model.lora = {}
        model.lora.merge = True
    return merged
