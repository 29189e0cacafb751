"""When the periodic reference is refreshed: every K optimizer steps and/or when a moving average of the token KL
to the reference exceeds κ (paper §5, "Iterative reference updates"; the authors' code has no periodic scheme).

Pure Python, no verl: `rpg.reference.periodic` feeds it once per training step and stores `state_dict()` in
checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from rpg.modes import check_refresh_settings

__all__ = ["ReferenceState", "RefreshSchedule"]


@dataclass
class ReferenceState:
    """Serializable state of `RefreshSchedule` (what a checkpoint stores)."""

    train_steps: int = 0  # training steps (update_actor calls) seen
    optimizer_steps: int = 0  # optimizer steps seen
    steps_since_refresh: int = 0  # optimizer steps since the last refresh (or the start)
    kl_ema: Optional[float] = None  # moving average of the token KL to the current reference; None = restarted
    history: list = field(default_factory=list)  # one dict per refresh: train_step, optimizer_step, reason, kl_ema


def _finite_non_negative(x) -> bool:
    """Whether `x` is a number (not a bool), finite and ≥ 0."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


class RefreshSchedule:
    """When to set π_ref ← π_θ: every K optimizer steps and/or when the KL moving average exceeds κ.

    Call `update` once per training step (the only points where verl can change the reference) with the number of
    optimizer steps it made and the token KL measured during it. Returns True when the reference must be refreshed
    now; the schedule then restarts (steps since refresh = 0, EMA forgotten). ``K = 0`` / ``κ = 0`` disable a
    criterion. The step criterion is checked first, so a refresh reason is "steps" whenever both fire.

    Args:
        every_steps: K, in optimizer steps (``ref_refresh_steps``).
        kl_threshold: κ (``ref_refresh_kl``), compared with the EMA after it is updated.
        ema_decay: d in ``ema ← d·ema + (1 − d)·kl`` (``ref_kl_ema``), d ∈ [0, 1).
    """

    def __init__(self, every_steps: int = 0, kl_threshold: float = 0.0, ema_decay: float = 0.9):
        check_refresh_settings(every_steps, kl_threshold, ema_decay, "RefreshSchedule")
        self.every_steps = int(every_steps)
        self.kl_threshold = float(kl_threshold)
        self.ema_decay = float(ema_decay)
        self.state = ReferenceState()
        self.last_reason: Optional[str] = None

    def update(self, kl: Optional[float], optimizer_steps: int = 1) -> bool:
        """Account one training step of ``optimizer_steps`` optimizer steps with measured token KL ``kl``.

        ``kl=None`` (nothing measured) leaves the EMA unchanged. Returns True if the reference must be refreshed.
        """
        if int(optimizer_steps) != optimizer_steps or optimizer_steps < 1:
            raise ValueError(f"optimizer_steps must be an integer ≥ 1, got {optimizer_steps!r}")
        s = self.state
        s.train_steps += 1
        s.optimizer_steps += int(optimizer_steps)
        s.steps_since_refresh += int(optimizer_steps)
        if kl is not None and math.isfinite(kl):
            d = self.ema_decay
            s.kl_ema = float(kl) if s.kl_ema is None else d * s.kl_ema + (1.0 - d) * float(kl)
        reason = None
        if self.every_steps and s.steps_since_refresh >= self.every_steps:
            reason = "steps"
        elif self.kl_threshold and s.kl_ema is not None and s.kl_ema > self.kl_threshold:
            reason = "kl"
        self.last_reason = reason
        if reason is not None:
            s.history.append(
                {"train_step": s.train_steps, "optimizer_step": s.optimizer_steps, "reason": reason, "kl_ema": s.kl_ema}
            )
            s.steps_since_refresh = 0
            s.kl_ema = None
        return reason is not None

    @property
    def refresh_count(self) -> int:
        return len(self.state.history)

    def state_dict(self) -> dict:
        s = self.state
        return {
            "every_steps": self.every_steps,
            "kl_threshold": self.kl_threshold,
            "ema_decay": self.ema_decay,
            "train_steps": s.train_steps,
            "optimizer_steps": s.optimizer_steps,
            "steps_since_refresh": s.steps_since_refresh,
            "kl_ema": s.kl_ema,
            "history": [dict(h) for h in s.history],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the counters, EMA and history. K, κ and d stay as configured (a resumed run may change them).

        Raises ValueError naming the key for a missing or malformed entry: counters must be integers ≥ 0, the EMA
        None or a finite number ≥ 0 (the token KL estimate is non-negative), the history a list of dicts.
        """
        missing = {"train_steps", "optimizer_steps", "steps_since_refresh", "kl_ema", "history"} - set(state)
        if missing:
            raise ValueError(f"RefreshSchedule state is missing keys {sorted(missing)}")
        counters = {}
        for key in ("train_steps", "optimizer_steps", "steps_since_refresh"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RefreshSchedule state {key}={value!r} must be an integer ≥ 0")
            counters[key] = value
        ema = state["kl_ema"]
        if ema is not None and not _finite_non_negative(ema):
            raise ValueError(f"RefreshSchedule state kl_ema={ema!r} must be null or a finite number ≥ 0")
        history = state["history"]
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise ValueError(f"RefreshSchedule state history={history!r} must be a list of refresh records")
        self.state = ReferenceState(
            **counters, kl_ema=None if ema is None else float(ema), history=[dict(h) for h in history]
        )
