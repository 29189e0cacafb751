"""The periodic reference (``reference='periodic'``, paper §5 "Iterative reference updates": "set the reference to the
current policy every K optimizer steps, or when a moving average of the token-level KL exceeds κ"; the authors' code
does not implement it): π_ref ← π_θ, a copy of each rank's own shards, on the schedule of
`rpg.reference.schedule.RefreshSchedule`.

verl computes ``ref_log_prob`` once per training step *before* the update, so the reference can only change between
training steps: a refresh fires at the end of the first training step after which ≥ K optimizer steps have passed
(exactly every K optimizer steps when M·epochs divides K), or after which the KL moving average exceeds κ. The KL
measured for κ is the importance-weighted k3 estimate of KL(π_θ‖π_ref) per token on π_old samples
(`rpg.reference.adapter.token_kl_to_reference`, summed by the training step `rpg.reference.step.TrainingStep`),
token-averaged over the whole training step and all data-parallel ranks. The moving average is updated once per
training step, ``ema ← d·ema + (1−d)·kl`` (``d = ref_kl_ema``; the first value after a (re)start is the measured KL
itself), and restarts at a refresh because the reference changed.

Metrics (the table's row, `rpg.modes`): ``actor/rpg/ref_refreshed`` (1 on a refresh step), ``ref_kl``,
``ref_kl_ema``, ``ref_refresh_count``, ``ref_steps_since_refresh``, ``ref_refresh_time_s`` (seconds spent copying, 0
without a refresh); rank 0 also prints one line per refresh with the step numbers. With SMOKE=1 every rank checks that
its reference shards equal the actor's after each refresh (`verify_copy`). The checkpoint and the worker hooks:
`rpg.reference.written`, `rpg.reference.hooks`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from rpg import modes
from rpg.reference.ranks import rank
from rpg.reference.schedule import RefreshSchedule
from rpg.reference.weights import copy_policy_weights
from rpg.reference.written import WrittenReference
from rpg.shards import local_shard

__all__ = ["PeriodicReference", "verify_copy"]


def verify_copy(src: torch.nn.Module, dst: torch.nn.Module) -> tuple[int, float]:
    """Check, on this rank, that every local shard of ``dst`` equals ``src``'s (cast to ``dst``'s dtype, compared on
    ``dst``'s device: e.g. the offloaded reference's CPU memory). Returns (tensors compared, float64 checksum of the
    reference's local shards); raises RuntimeError naming the first tensor that differs."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    with torch.no_grad():
        a, b = get_model_state_dict(src), get_model_state_dict(dst)
        if a.keys() != b.keys():
            differ = sorted(a.keys() ^ b.keys())[:5]
            raise RuntimeError(f"reference refresh check: actor and reference state dicts differ in keys {differ}")
        checksum = 0.0
        for name in a:
            x, y = local_shard(a[name]), local_shard(b[name])
            if not torch.equal(x.to(device=y.device, dtype=y.dtype), y):
                raise RuntimeError(
                    f"reference refresh check: rank {rank()}'s shard of {name} differs from the actor's after the "
                    "refresh"
                )
            checksum += float(y.double().sum())
    return len(a), checksum


class PeriodicReference(WrittenReference):
    """The ``periodic`` row's worker state: copy the actor's weights into the reference on the schedule."""

    row = modes.REFERENCES["periodic"]

    @classmethod
    def from_settings(cls, settings: Any, actor: Any, ref: Any) -> "PeriodicReference":
        schedule = RefreshSchedule(settings.ref_refresh_steps, settings.ref_refresh_kl, settings.ref_kl_ema)
        return cls(schedule, actor, ref)

    def write(self, actor: torch.nn.Module, ref: torch.nn.Module) -> None:
        copy_policy_weights(actor, ref)

    def verify(self, actor: torch.nn.Module, ref: torch.nn.Module, before: Any) -> None:
        n, checksum = verify_copy(actor, ref)
        step = self.schedule.state.history[-1]["train_step"]
        print(
            f"[rpg.reference] rank {rank()}: reference = actor after the refresh at training step {step} ({n} shard "
            f"tensors equal, checksum {checksum:.9e})",
            flush=True,
        )

    def metrics(self, written: bool, ref_kl: Optional[float]) -> dict[str, float]:
        s = self.schedule.state
        if written and rank() == 0:
            last = s.history[-1]
            print(
                f"[rpg.reference] reference <- policy at training step {last['train_step']} (optimizer step "
                f"{last['optimizer_step']}, reason={last['reason']}, kl_ema={last['kl_ema']}); refresh "
                f"#{len(s.history)}",
                flush=True,
            )
        metrics = {
            "ref_refreshed": float(written),
            "ref_refresh_count": float(len(s.history)),
            "ref_steps_since_refresh": float(s.steps_since_refresh),
            "ref_refresh_time_s": self.last_write_s,
        }
        if ref_kl is not None:
            metrics["ref_kl"] = float(ref_kl)
        ema = s.history[-1]["kl_ema"] if written else s.kl_ema
        if ema is not None:
            metrics["ref_kl_ema"] = float(ema)
        return metrics
