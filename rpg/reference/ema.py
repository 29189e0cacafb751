"""The EMA (Polyak) reference (``reference='ema'``; EMA-PG, arXiv 2602.04417): π_ref ← τ·π_ref + (1 − τ)·π_θ every
``ref_ema_period`` optimizer steps, an fp32 blend of each rank's own reference shards
(`rpg.reference.weights.blend_policy_weights`).

It runs the periodic reference's machinery (`rpg.reference.written`) with the schedule K = ``ref_ema_period`` (no κ):
the blend happens at the end of the first training step with ≥ P optimizer steps since the last one. Metrics (the
table's row, `rpg.modes`): ``actor/rpg/ref_ema_updated``, ``ref_ema_update_count``,
``ref_ema_steps_since_update``, ``ref_ema_time_s``, ``ref_ema_decay`` and ``ref_kl``; its checkpoint is
``rpg_reference/`` (state.json records the mode). With SMOKE=1 every rank checks each blend on its own shards:
Σ new = τ·Σ old + (1 − τ)·Σ actor in float64 sums, relative 1e-6 (`verify_blend`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from rpg import modes
from rpg.reference.ranks import rank
from rpg.reference.schedule import RefreshSchedule
from rpg.reference.weights import blend_policy_weights, reshard_fsdp2
from rpg.reference.written import WrittenReference
from rpg.shards import local_shard

__all__ = ["BLEND_RTOL", "EmaReference", "shard_sum", "verify_blend"]

BLEND_RTOL = 1e-6


def shard_sum(module: torch.nn.Module) -> tuple[float, float]:
    """(Σ, Σ|·|) over this rank's own shards of every parameter, in float64 (fp32 values, as the blend reads them)."""
    reshard_fsdp2(module)
    total = absolute = 0.0
    with torch.no_grad():
        for p in module.parameters():
            x = local_shard(p).to(torch.float32).double()
            total, absolute = total + float(x.sum()), absolute + float(x.abs().sum())
    return total, absolute


def verify_blend(decay: float, old: float, actor: float, new: tuple[float, float]) -> float:
    """The relative gap |Σ new − (τ·Σ old + (1 − τ)·Σ actor)| / Σ|new| of one rank's shards; RuntimeError above
    `BLEND_RTOL`."""
    expected = decay * old + (1.0 - decay) * actor
    gap = abs(new[0] - expected) / max(new[1], 1e-30)
    if not gap <= BLEND_RTOL:
        raise RuntimeError(
            f"EMA reference check: rank {rank()}'s shards after the blend sum to {new[0]!r}, expected "
            f"τ·Σ old + (1 − τ)·Σ actor = {expected!r} (τ = {decay}; relative gap {gap:.3e} > {BLEND_RTOL})"
        )
    return gap


class EmaReference(WrittenReference):
    """The ``ema`` row's worker state: blend the actor's weights into the reference every P optimizer steps."""

    row = modes.REFERENCES["ema"]

    def __init__(self, schedule: RefreshSchedule, actor: Any, ref: Any, ema_decay: float):
        super().__init__(schedule, actor, ref)
        self.ema_decay = float(ema_decay)
        self.last_check: Optional[float] = None  # SMOKE=1: the relative gap of the last blend on this rank

    @classmethod
    def from_settings(cls, settings: Any, actor: Any, ref: Any) -> "EmaReference":
        # the EMA update period is the periodic reference's K, in optimizer steps
        return cls(RefreshSchedule(settings.ref_ema_period), actor, ref, ema_decay=settings.ref_ema_decay)

    def write(self, actor: torch.nn.Module, ref: torch.nn.Module) -> None:
        blend_policy_weights(actor, ref, self.ema_decay)

    def before_write(self, actor: torch.nn.Module, ref: torch.nn.Module) -> float:
        return shard_sum(ref)[0]

    def verify(self, actor: torch.nn.Module, ref: torch.nn.Module, before: float) -> None:
        self.last_check = verify_blend(self.ema_decay, before, shard_sum(actor)[0], shard_sum(ref))
        step = self.schedule.state.history[-1]["train_step"]
        print(
            f"[rpg.reference] rank {rank()}: EMA reference = τ·old + (1 − τ)·actor after the blend at training step "
            f"{step} (float64 shard sums, relative gap {self.last_check:.1e})",
            flush=True,
        )

    def metrics(self, written: bool, ref_kl: Optional[float]) -> dict[str, float]:
        s = self.schedule.state
        metrics = {
            "ref_ema_updated": float(written),
            "ref_ema_update_count": float(len(s.history)),
            "ref_ema_steps_since_update": float(s.steps_since_refresh),
            "ref_ema_time_s": self.last_write_s,
            "ref_ema_decay": self.ema_decay,
        }
        if ref_kl is not None:
            metrics["ref_kl"] = float(ref_kl)
        return metrics
