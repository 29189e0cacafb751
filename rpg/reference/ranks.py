"""The data-parallel ranks of verl's actor worker as the reference modes see them (no-ops without torch.distributed)."""

from __future__ import annotations

import torch

__all__ = ["all_reduce_sum", "barrier", "dist_ready", "rank", "reject_constant"]


def dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if dist_ready() else 0


def barrier() -> None:
    if dist_ready():
        torch.distributed.barrier()


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum `values` over the ranks in float64 (CPU tensor: gloo, the cpu:gloo backend verl always adds)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist_ready() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(t)
    return t.tolist()


def reject_constant(name: str):
    """`json.load(parse_constant=...)`: a state file with NaN/Infinity is corrupt."""
    raise ValueError(f"non-finite number {name} (kl_ema must be null or a finite number ≥ 0)")
