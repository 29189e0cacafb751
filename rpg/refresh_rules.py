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
