"""The one place that looks inside an FSDP2 parameter: a `torch.distributed.tensor.DTensor`'s rank-local shard and its
full tensor, for the code that reads or writes weights rank by rank (the periodic and EMA references, schedule-free's
iterates, the CPU rollout's weight sync). A plain tensor (FSDP1, a single process) passes through unchanged.

Duck-typed on DTensor's public methods (``to_local``, ``full_tensor``), so importing this module imports nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["full_tensor", "local_shard"]


def local_shard(t: Any) -> Any:
    """The rank-local shard of a DTensor (a view sharing its storage: writing it writes the parameter), or `t`."""
    return t.to_local() if hasattr(t, "to_local") else t


def full_tensor(t: Any) -> Any:
    """The whole tensor of a DTensor (a collective: every rank of its mesh must call it), or `t`."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
