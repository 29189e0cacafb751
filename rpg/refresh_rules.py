"""The valid settings of the periodic reference's refresh schedule (paper §5, "Iterative reference updates"), checked
in one place: by `rpg.loss_config.RPGPolicyLossConfig` (its `ref_refresh_*` fields) and by
`rpg.reference.schedule.RefreshSchedule` (its arguments). Pure Python; imports nothing from rpg."""

from __future__ import annotations

import math
from typing import Any


def check_refresh_settings(
    every_steps: Any,
    kl_threshold: Any,
    ema_decay: Any,
    owner: str,
    names: tuple[str, str, str] = ("every_steps (K)", "kl_threshold (κ)", "ema_decay"),
    need_a_criterion: bool = True,
) -> None:
    """Raise ValueError naming `owner` and the setting when K is not an integer ≥ 0, κ not a finite number ≥ 0, the
    EMA decay not in [0, 1), or (with `need_a_criterion`) neither K > 0 nor κ > 0."""
    k_name, kappa_name, decay_name = names

    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if not number(every_steps) or int(every_steps) != every_steps or every_steps < 0:
        raise ValueError(f"{owner}: {k_name} must be an integer ≥ 0, got {every_steps!r}")
    if not number(kl_threshold) or not (math.isfinite(kl_threshold) and kl_threshold >= 0):
        raise ValueError(f"{owner}: {kappa_name} must be a finite number ≥ 0, got {kl_threshold!r}")
    if not number(ema_decay) or not (0.0 <= ema_decay < 1.0):
        raise ValueError(f"{owner}: {decay_name} must be in [0, 1), got {ema_decay!r}")
    if need_a_criterion and every_steps == 0 and kl_threshold == 0:
        raise ValueError(f"{owner} needs {k_name} > 0 and/or {kappa_name} > 0")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_ema_settings(decay: Any, period: Any, owner: str) -> None:
    """Raise ValueError naming `owner` and the setting when the EMA reference's τ (`ref_ema_decay`) is not in [0, 1)
    or its period P (`ref_ema_period`, optimizer steps) is not an integer ≥ 1."""
    if not _number(decay) or not (0.0 <= decay < 1.0):
        raise ValueError(
            f"{owner}: ref_ema_decay (τ of the EMA reference, π_ref ← τ·π_ref + (1 − τ)·π_θ) must be in [0, 1), got "
            f"{decay!r} (τ = 1 never moves the reference: use reference=frozen)"
        )
    if not _number(period) or int(period) != period or period < 1:
        raise ValueError(
            f"{owner}: ref_ema_period (optimizer steps between EMA updates, the unit of ref_refresh_steps) must be an "
            f"integer ≥ 1, got {period!r}"
        )


MIN_HORIZON = 0.2  # the controller's clipped error is in [−0.2, 0.2]: H > 0.2 keeps every multiplier 1 + e/H > 0


def check_kl_control_settings(target: Any, horizon: Any, owner: str, adaptive: bool, kl_coef: Any = None) -> None:
    """Raise ValueError naming `owner` and the setting when the adaptive-β controller's target is not a finite number
    (> 0 when `adaptive`, ≥ 0 otherwise), its horizon not a finite number > 0.2, or (`adaptive`) β's start `kl_coef`
    is 0 (a multiplicative controller never leaves 0)."""
    if not _number(target) or not math.isfinite(target) or target < 0 or (adaptive and target == 0):
        raise ValueError(
            f"{owner}: kl_target (target of the adaptive β, per-token KL of the chosen divergence) must be a finite "
            f"number > 0 with kl_control='adaptive', got {target!r}"
        )
    if not _number(horizon) or not math.isfinite(horizon) or horizon <= MIN_HORIZON:
        raise ValueError(
            f"{owner}: kl_horizon (H, in training steps; β ← β·(1 + clip(KL/target − 1, ±0.2)/H)) must be a finite "
            f"number > {MIN_HORIZON}, got {horizon!r}"
        )
    if adaptive and kl_coef is not None and not (_number(kl_coef) and kl_coef > 0):
        raise ValueError(
            f"{owner}: kl_control='adaptive' starts β at kl_coef and multiplies it each step, so kl_coef must be > 0, "
            f"got {kl_coef!r}"
        )
