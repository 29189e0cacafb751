"""The adaptive KL coefficient β of the RPG losses: the proportional controller of Ziegler et al. 2019 (arXiv
1909.08593, §2.2), as verl's `AdaptiveKLController`, on the loss path instead of verl's in-reward KL.

Per training step t, with the KL estimate KL_t averaged over the step's tokens and all data-parallel ranks:

    e_t = clip(KL_t / target − 1, −0.2, 0.2),     β_{t+1} = β_t · (1 + e_t / H)

β_1 = `kl_coef`. H (`kl_horizon`) counts *training steps* (verl's horizon counts sequences, `n_steps` = batch size:
verl's H_v with B sequences per step is H = H_v / B here; Ziegler's K_β = 1/H). β is constant within a training step:
the losses read `current_kl_coef(settings)`; the controller is updated at the end of `update_actor`
(`rpg.reference.periodic`, the worker hooks), identically on every rank (the KL is all-reduced first).

What KL: the loss's own estimate of the chosen divergence to the KL reference (`actor/rpg/kl`, `Divergence.estimate`:
k3-type, ≥ 0 per token), at the current θ of each micro-batch, token-averaged over the whole training step (all
mini-batches and epochs) and all ranks (`KL_OBSERVER`, fed by `rpg.losses`). With the iterative reference (π_ref =
π_old) that is the drift of the policy within one training step (0 on the first micro-batch of every step); with a
frozen, periodic or EMA reference it is the KL to that reference.

Pure Python except `KL_OBSERVER` (floats already on the host: the losses' one metric transfer).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from rpg.refresh_rules import check_kl_control_settings

__all__ = ["AdaptiveKLCoef", "KL_OBSERVER", "current_kl_coef", "ERROR_CLIP"]

ERROR_CLIP = 0.2  # verl's AdaptiveKLController and Ziegler et al. 2019


class AdaptiveKLCoef:
    """β ← β·(1 + clip(KL/target − 1, ±0.2)/H), once per training step (`update`); state saved exactly (floats)."""

    def __init__(self, kl_coef: float, target: float, horizon: float):
        check_kl_control_settings(target, horizon, "AdaptiveKLCoef", adaptive=True, kl_coef=kl_coef)
        self.value = float(kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)
        self.updates = 0  # training steps accounted
        self.last_kl: Optional[float] = None

    def update(self, kl: Optional[float]) -> float:
        """Account one training step whose averaged KL estimate is `kl`; return the β of the next step. A step that
        measured nothing (`kl` None or not finite: no valid token) leaves β unchanged."""
        self.updates += 1
        if kl is None or not math.isfinite(kl):
            return self.value
        self.last_kl = float(kl)
        error = min(max(self.last_kl / self.target - 1.0, -ERROR_CLIP), ERROR_CLIP)
        self.value *= 1.0 + error / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"kl_coef": self.value, "updates": self.updates, "last_kl": self.last_kl,
                "target": self.target, "horizon": self.horizon}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """Restore β and the counters (target and horizon stay as configured: a resumed run may change them).
        Raises ValueError naming the key for a missing or malformed entry."""
        missing = {"kl_coef", "updates", "last_kl"} - set(state)
        if missing:
            raise ValueError(f"adaptive-β state is missing keys {sorted(missing)}")
        value, updates, last = state["kl_coef"], state["updates"], state["last_kl"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"adaptive-β state kl_coef={value!r} must be a finite number > 0")
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 0:
            raise ValueError(f"adaptive-β state updates={updates!r} must be an integer ≥ 0")
        if last is not None and (isinstance(last, bool) or not isinstance(last, (int, float))
                                 or not math.isfinite(last)):  # fmt: skip
            raise ValueError(f"adaptive-β state last_kl={last!r} must be null or a finite number")
        self.value, self.updates, self.last_kl = float(value), updates, None if last is None else float(last)


class _KLObserver:
    """Σ KL̂ and #tokens of the loss's KL estimate over one training step (host floats), fed by `rpg.losses`."""

    def __init__(self) -> None:
        self.active = False
        self.kl_sum = self.tokens = 0.0

    def start(self) -> None:
        self.active, self.kl_sum, self.tokens = True, 0.0, 0.0

    def add(self, kl_sum: float, tokens: float) -> None:
        if self.active:
            self.kl_sum += kl_sum
            self.tokens += tokens

    def stop(self) -> tuple[float, float]:
        self.active = False
        return self.kl_sum, self.tokens


KL_OBSERVER = _KLObserver()
_ACTIVE: list[AdaptiveKLCoef] = []  # the controller of this worker process (set by the worker hooks)


def activate(controller: Optional[AdaptiveKLCoef]) -> None:
    """Make `controller` the one `current_kl_coef` reads in this process (None: none)."""
    _ACTIVE[:] = [] if controller is None else [controller]


def current_kl_coef(settings: Any) -> float:
    """β for the loss now: `settings.kl_coef` with kl_control='fixed', else the active controller's value.

    Raises RuntimeError when kl_control='adaptive' and no controller is active in this process (the loss was called
    outside verl's actor worker `update_actor`, where the hooks of `rpg.reference.periodic` build it)."""
    if getattr(settings, "kl_control", "fixed") != "adaptive":
        return settings.kl_coef
    if not _ACTIVE:
        raise RuntimeError(
            "kl_control='adaptive': no adaptive-β controller is active in this process. It is built by rpg's hooks "
            "on verl's ActorRolloutRefWorker.update_actor (rpg/reference/periodic.py); the loss was called outside "
            "it. Use kl_control='fixed' there, or call rpg.reference.adaptive_kl.activate(controller) first."
        )
    return _ACTIVE[0].value
