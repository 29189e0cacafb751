"""The adaptive KL coefficient β of the RPG losses: the proportional controller of Ziegler et al. 2019 (arXiv
1909.08593, §2.2), as verl's `AdaptiveKLController`, on the loss path instead of verl's in-reward KL.

Per training step t, with the KL estimate KL_t averaged over the step's tokens and all data-parallel ranks:

    e_t = clip(KL_t / target − 1, −0.2, 0.2),     β_{t+1} = β_t · (1 + e_t / H)

β_1 = `kl_coef`. H (`kl_horizon`) counts *training steps* (verl's horizon counts sequences, `n_steps` = batch size:
verl's H_v with B sequences per step is H = H_v / B here; Ziegler's K_β = 1/H). β is constant within a training step:
the losses read the β of the training step (`rpg.reference.step.kl_coef`); the controller is updated at the end of
`update_actor` (`AdaptiveBeta`, built by the worker hooks `rpg.reference.hooks`), identically on every rank (the KL is
all-reduced first).

What KL: the per-token KL the loss regularises (`rpg.modes.ESTIMATORS`): with
kl_estimator=sampled the loss's own estimate of the chosen divergence to the KL reference (`actor/rpg/kl`,
`Divergence.estimate`: k3-type, ≥ 0 per token), with kl_estimator=topk the top-k KL (`actor/rpg/topk_kl`); at the
current θ of each micro-batch, token-averaged over the whole training step (all mini-batches and epochs) and all ranks
(the step's ``loss_kl`` sum, handed over once per loss call by `rpg.losses.policy_loss_fn`). With the iterative
reference (π_ref = π_old) that is the drift of the policy within one training step (0 on the first micro-batch of
every step); with a frozen, periodic or EMA reference it is the KL to that reference (docs/losses.md#adaptive-beta).

Metrics (the table's row, `rpg.modes`): ``actor/rpg/kl_coef`` (the β of this step), ``kl_coef_next``,
``kl_ctrl_kl``. ``global_step_N/actor/rpg_kl_control.json`` (rank 0, atomic; read by rank 0 on resume and broadcast)
stores the controller.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

from rpg.atomic import atomic_write_json
from rpg import modes
from rpg.modes import check_kl_control_settings
from rpg.reference.ranks import barrier, dist_ready, rank, reject_constant
from rpg.reference.step import TrainingStep

__all__ = ["AdaptiveBeta", "AdaptiveKLCoef", "ERROR_CLIP"]

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
                "target": self.target, "horizon": self.horizon}

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
                                 or not math.isfinite(last)):
            raise ValueError(f"adaptive-β state last_kl={last!r} must be null or a finite number")
        self.value, self.updates, self.last_kl = float(value), updates, None if last is None else float(last)


KL_CONTROL_FILE = "rpg_kl_control.json"
STATE_VERSION = 1


class AdaptiveBeta:
    """The ``adaptive`` row's worker state: the controller, the β of each training step, its checkpoint."""

    row = modes.KL_CONTROLS["adaptive"]

    def __init__(self, controller: AdaptiveKLCoef):
        self.controller = controller

    @classmethod
    def from_settings(cls, settings: Any, actor: Any, ref: Any) -> "AdaptiveBeta":
        return cls(AdaptiveKLCoef(settings.kl_coef, settings.kl_target, settings.kl_horizon))

    def start_step(self, step: TrainingStep) -> None:
        step.beta, step.measure_loss_kl = self.controller.value, True  # the β the losses read during this step

    def end_step(self, ref_kl: Optional[float], loss_kl: Optional[float]) -> dict[str, float]:
        used = self.controller.value
        self.controller.update(loss_kl)
        metrics = {"kl_coef": used, "kl_coef_next": self.controller.value}
        if loss_kl is not None:
            metrics["kl_ctrl_kl"] = loss_kl
        return metrics

    def save(self, local_path: str, global_step: int) -> None:
        """Rank 0 writes ``<local_path>/rpg_kl_control.json`` (atomically; floats round-trip exactly through JSON)."""
        if rank() == 0:
            payload = {"version": STATE_VERSION, "global_step": int(global_step),
                       "controller": self.controller.state_dict()}
            atomic_write_json(os.path.join(local_path, KL_CONTROL_FILE), payload, indent=2, sort_keys=True)
        barrier()

    def load(self, local_path: str) -> None:
        """Rank 0 reads the controller state saved by `save` and broadcasts it (only rank 0's node needs the file);
        every rank raises the same error when it is missing (saved with kl_control='fixed') or corrupt."""
        import torch

        path = os.path.join(local_path, KL_CONTROL_FILE)
        message: list = [None]
        if rank() == 0:
            try:
                with open(path) as f:
                    payload = json.load(f, parse_constant=reject_constant)
                if not isinstance(payload, dict) or payload.get("version") != STATE_VERSION:
                    raise ValueError(f"unsupported state version (this rpg-verl reads {STATE_VERSION})")
                message[0] = ("ok", payload["controller"])
            except FileNotFoundError:
                message[0] = ("missing", None)
            except (ValueError, KeyError, TypeError) as e:
                message[0] = ("corrupt", str(e))
        if dist_ready() and torch.distributed.get_world_size() > 1:
            torch.distributed.broadcast_object_list(message, src=0)
        status, value = message[0]
        if status == "missing":
            raise RuntimeError(
                f"kl_control='adaptive' cannot resume from {local_path}: it has no {path} (the checkpoint was saved "
                "with kl_control='fixed', or without rpg-verl), so β at that step is unknown. Resume with the "
                "kl_control it was trained with, or start a new run from its weights with trainer.resume_mode=disable."
            )
        try:
            if status == "corrupt":
                raise ValueError(value)
            self.controller.load_state_dict(value)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"corrupt adaptive-β state {path}: {e}") from e
