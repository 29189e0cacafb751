"""verl's LoRA settings of a run, read once (docs/reference-modes.md#lora).

verl 0.9.1 has two places for the rank: the FSDP engine's ``actor_rollout_ref.model.lora_rank`` and the newer
``actor_rollout_ref.model.lora.rank`` block (Megatron's, but verl's trainer reads it first). A run is a LoRA run, and
verl then computes the reference "in the actor" with the adapter disabled, when either rank is positive or a
``lora_adapter_path`` is given (``ref_in_actor``, verl/trainer/ppo/v1/trainer_base.py:234-237). ``lora.merge``
decides how the adapter reaches the rollout (merged into the base weights, or loaded as a separate adapter; verl's
engine_workers.py:675). Every RPG check of LoRA reads `lora_settings`, so they all agree with verl on what a LoRA run
is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["LoraSettings", "lora_settings"]


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA settings verl's FSDP engine reads (rank 0 and no adapter path: not a LoRA run)."""

    rank: int
    alpha: Optional[float]
    target_modules: Any
    merge: bool
    adapter_path: Optional[str]

    @property
    def enabled(self) -> bool:
        """verl's ``ref_in_actor``: a positive rank, or an adapter to start from."""
        return self.rank > 0 or self.adapter_path is not None

    @property
    def rank_setting(self) -> str:
        """The override a message should name for the rank."""
        return "actor_rollout_ref.model.lora_rank"


def _get(node: Any, key: str, default: Any = None) -> Any:
    if node is None:
        return default
    value = node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)
    return default if value is None else value


def lora_settings(config: Any) -> LoraSettings:
    """The run's `LoraSettings` from the composed config (DictConfig or dict): ``model.lora.rank`` first, then
    ``model.lora_rank``, as verl's trainer reads them; ``lora.merge``; ``lora_adapter_path``. Defaults are verl's
    (its model yaml): none is repeated here, a missing setting reads as None/0/False."""
    model = _get(_get(config, "actor_rollout_ref"), "model")
    block = _get(model, "lora", {})
    rank = int(_get(block, "rank", 0) or 0)
    if rank <= 0:
        rank = int(_get(model, "lora_rank", 0) or 0)
    adapter = _get(model, "lora_adapter_path", None)
    alpha = _get(model, "lora_alpha", None)
    return LoraSettings(
        rank=rank,
        alpha=None if alpha is None else float(alpha),
        target_modules=_get(model, "target_modules", None),
        merge=bool(_get(block, "merge", False)),
        adapter_path=None if adapter in (None, "") else str(adapter),
    )
