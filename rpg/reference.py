"""The KL reference policy of RPG inside verl 0.9.1: `iterative`, `frozen` and `periodic` (SPEC §6.2, D10, D15).

Modes (``actor_rollout_ref.actor.policy_loss.reference``, see `rpg.config.RPGPolicyLossConfig`):

* ``iterative`` (default; paper §5 and every RPG script): π_ref = π_old, the policy that sampled the batch. The losses
  use ``old_log_prob``; no reference model is built (``actor.use_kl_loss=False``), nothing in this module runs.
* ``frozen``: π_ref = the initial model, computed by verl's own reference worker (``actor.use_kl_loss=True`` with
  ``actor.kl_loss_coef=0`` so that verl builds it and ships ``ref_log_prob`` but adds no KL term of its own). This is
  the Fig. 9 "no iterative reference" ablation. The losses use the ρ-weighted surrogates (SPEC §6.2, D10).
* ``periodic``: the paper's scheme "set the reference to the current policy every K optimizer steps, or when a moving
  average of the token-level KL exceeds κ" (SPEC §6.2; the authors' code never implements it, D15). Same verl setup as
  ``frozen``; in addition the reference weights are overwritten with the actor's on the schedule below.

Cost: ``frozen``/``periodic`` keep a second copy of the weights (the reference engine; verl shards/offloads it like the
actor's parameters, without optimizer state) and run one extra forward pass per training step (verl's
``compute_ref_log_prob``). A ``periodic`` refresh copies the actor's parameter shards into the reference's (a memory
copy of each rank's own shards when both engines use the same FSDP2 layout; no forward pass).

Three pieces, all installed by `install()` (called from `rpg.verl_plugin`, i.e. on ``import verl`` in every process):

1. **ref_log_prob adapter.** verl's registered policy losses receive no ``ref_log_prob`` (verl-0.9.1 notes §2.3).
   verl's actor loss is ``verl.workers.utils.losses.ppo_loss``, which already receives the micro-batch with
   ``ref_log_prob``. `install()` wraps that one function: the wrapper pads ``ref_log_prob`` exactly as ``ppo_loss``
   pads ``old_log_probs`` and publishes it in a `contextvars.ContextVar` for the duration of the call; a registered
   loss reads it with `current_ref_log_prob()`. The wrapper is applied to the module attribute *and* to the copy that
   ``verl.workers.engine_workers`` binds with ``from ... import ppo_loss``. To keep ``import verl`` cheap and not
   require verl's worker dependencies, nothing is imported eagerly: a post-import hook patches each module the moment
   it is first imported (or immediately, if it already is). Distillation (``distillation_ppo_loss``) is not covered.
2. **Periodic refresh.** ``ActorRolloutRefWorker.update_actor`` (one call = one training step = M·epochs optimizer
   steps, M mini-batches) is wrapped. With ``reference='periodic'`` the wrapper counts the optimizer steps (the actor
   engine's ``optimizer_step`` calls, whatever the batch format or mini-batch/epoch settings), measures
   the token KL to the reference during the update (from the same ``ppo_loss`` wrapper), feeds both to a
   `RefreshSchedule`, and on a refresh copies the actor's weights into the fused reference engine
   (`copy_policy_weights`). Because verl computes ``ref_log_prob`` once per training step *before* the update, the
   reference can only change between training steps: a refresh fires at the end of the first training step after
   which ≥ K optimizer steps have passed (exactly every K optimizer steps when M·epochs divides K), or after which the
   KL moving average exceeds κ. Metrics: ``actor/rpg/ref_refreshed`` (1 on a refresh step), ``actor/rpg/ref_kl``,
   ``actor/rpg/ref_kl_ema``, ``actor/rpg/ref_refresh_count``, ``actor/rpg/ref_steps_since_refresh``,
   ``actor/rpg/ref_refresh_time_s`` (seconds spent copying, 0 without a refresh); rank 0 also
   prints one line per refresh with the step numbers. Any other mode: the wrapper is a pass-through.
3. **Checkpoint/resume.** ``save_checkpoint``/``load_checkpoint`` of the same worker are wrapped. Next to verl's actor
   checkpoint (``global_step_N/actor/``) ``rpg_reference/state.json`` stores the schedule (steps since the last
   refresh, KL EMA, refresh history) and, once a refresh has happened, ``rpg_reference/ref_model/`` stores the
   reference weights (torch.distributed.checkpoint format). Both are written
   atomically (temp + rename). A resumed run therefore uses the same reference and refreshes at exactly the same
   steps as an uninterrupted one. (They are read *before* verl's own load, which may delete the local checkpoint.)

The KL measured for κ is the importance-weighted k3 estimate of KL(π_θ‖π_ref) per token on π_old samples,
``w·k3(π_ref/π_θ)`` with ``w = π_θ/π_old`` (SPEC §5.3, the corrected GRPO estimator; ≥ 0 token-wise), evaluated at the
current θ of each micro-batch, token-averaged over the whole training step and all data-parallel ranks. The moving
average is updated once per training step, ``ema ← d·ema + (1−d)·kl`` (``d = ref_kl_ema``; the first value after a
(re)start is the measured KL itself), and restarts at a refresh because the reference changed.

Limits (clear errors, not silent): ``periodic`` needs the reference engine in the actor's process (verl's fused
``actor_rollout_ref`` role, i.e. the default hybrid engine without LoRA); the weight copy goes through torch's
distributed state-dict API (FSDP2 and plain modules are tested on CPU; FSDP1 is expected to work but untested here;
Megatron and other engines raise). HDFS checkpoint copies (``default_hdfs_dir``) do not include ``rpg_reference/``.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import importlib.util
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from tensordict import TensorDict

__all__ = [
    "PeriodicReference",
    "ReferenceState",
    "RefreshSchedule",
    "copy_policy_weights",
    "current_ref_log_prob",
    "install",
    "token_kl_to_reference",
]

logger = logging.getLogger(__name__)

Tensor = torch.Tensor

STATE_DIR = "rpg_reference"
STATE_FILE = "state.json"
REF_MODEL_DIR = "ref_model"
STATE_VERSION = 1
METRIC_PREFIX = "actor/rpg/"

_LOSSES_MODULE = "verl.workers.utils.losses"
_WORKERS_MODULE = "verl.workers.engine_workers"
_MARK = "__rpg_reference_wrapper__"


# ---------------------------------------------------------------------------------------------------------------------
# 1. ref_log_prob adapter
# ---------------------------------------------------------------------------------------------------------------------

_CURRENT_REF_LOG_PROB: contextvars.ContextVar[Optional[Tensor]] = contextvars.ContextVar(
    "rpg_current_ref_log_prob", default=None
)


def current_ref_log_prob() -> Optional[Tensor]:
    """The reference log-probs of the micro-batch currently inside verl's ``ppo_loss``.

    Returns a detached (bs, response_len) tensor, padded exactly like the ``old_log_prob``/``log_prob`` tensors the
    registered policy loss receives (zeros on padding), or None when verl shipped no ``ref_log_prob`` (no reference
    model: ``actor.use_kl_loss=False``) or when called outside ``ppo_loss``.
    """
    return _CURRENT_REF_LOG_PROB.get()


class _KLMeter:
    """Accumulates Σ_tokens KL and #tokens over one training step (detached, float64), fed by the ppo_loss wrapper."""

    def __init__(self) -> None:
        self.active = False
        self.kl_sum = 0.0
        self.tokens = 0.0

    def start(self) -> None:
        self.active, self.kl_sum, self.tokens = True, 0.0, 0.0

    def stop(self) -> tuple[float, float]:
        self.active = False
        return self.kl_sum, self.tokens

    def add(self, log_prob: Tensor, old_log_prob: Tensor, ref_log_prob: Tensor, mask: Tensor) -> None:
        kl_sum, tokens = token_kl_to_reference(log_prob, old_log_prob, ref_log_prob, mask)
        self.kl_sum += kl_sum
        self.tokens += tokens


_KL_METER = _KLMeter()


def token_kl_to_reference(
    log_prob: Tensor, old_log_prob: Tensor, ref_log_prob: Tensor, mask: Tensor
) -> tuple[float, float]:
    """(Σ KL̂, #tokens) of the importance-weighted k3 estimate of KL(π_θ‖π_ref) over the masked tokens.

    Per token (SPEC §5.3): ``w·k3(π_ref/π_θ) = w·(ρ' − 1 − log ρ')`` with ``ρ' = exp(ref − lp)`` and
    ``w = exp(lp − old)``; for tokens sampled from π_old its expectation is KL(π_θ(·|h)‖π_ref(·|h)), and it is ≥ 0.
    All inputs (bs, response_len); the result is detached (a monitoring statistic, no gradient). Log-ratios are
    clamped to ±20 so that garbage on padding or a wild ratio cannot produce inf/NaN.
    """
    with torch.no_grad():
        m = mask.to(torch.bool)
        lp = log_prob.detach().double()
        log_rho = (ref_log_prob.double() - lp).clamp(-20.0, 20.0).masked_fill(~m, 0.0)
        log_w = (lp - old_log_prob.double()).clamp(-20.0, 20.0).masked_fill(~m, 0.0)
        kl = torch.exp(log_w) * (torch.expm1(log_rho) - log_rho)
        return float(kl[m].sum()), float(m.sum())


_PPO_LOSS_WRAPPERS: dict[int, tuple[Callable, Callable]] = {}  # id(original) -> (original, wrapper)


def _wrap_ppo_loss(orig: Callable) -> Callable:
    """The (unique, cached) adapter wrapper of verl's ``ppo_loss``; returns ``orig`` if it already is one."""
    if getattr(orig, _MARK, False):
        return orig
    cached = _PPO_LOSS_WRAPPERS.get(id(orig))
    if cached is not None and cached[0] is orig:
        return cached[1]

    @functools.wraps(orig)
    def ppo_loss(config, model_output, data, dp_group=None):
        ref = None
        if "ref_log_prob" in data.keys():
            ref = data.select("ref_log_prob").to_padded_tensor()["ref_log_prob"].detach()
        if ref is not None and _KL_METER.active:
            from verl.workers.utils.padding import no_padding_2_padding

            padded = data.select("old_log_probs", "response_mask").to_padded_tensor()
            log_prob = no_padding_2_padding(model_output["log_probs"], data)
            _KL_METER.add(log_prob, padded["old_log_probs"], ref, padded["response_mask"])
        token = _CURRENT_REF_LOG_PROB.set(ref)
        try:
            return orig(config, model_output, data, dp_group=dp_group)
        finally:
            _CURRENT_REF_LOG_PROB.reset(token)

    setattr(ppo_loss, _MARK, True)
    _PPO_LOSS_WRAPPERS[id(orig)] = (orig, ppo_loss)
    return ppo_loss


# ---------------------------------------------------------------------------------------------------------------------
# 2. Refresh schedule (pure) and the weight copy
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class ReferenceState:
    """Serializable state of `RefreshSchedule` (what a checkpoint stores)."""

    train_steps: int = 0  # training steps (update_actor calls) seen
    optimizer_steps: int = 0  # optimizer steps seen
    steps_since_refresh: int = 0  # optimizer steps since the last refresh (or the start)
    kl_ema: Optional[float] = None  # moving average of the token KL to the current reference; None = restarted
    history: list = field(default_factory=list)  # one dict per refresh: train_step, optimizer_step, reason, kl_ema


class RefreshSchedule:
    """When to set π_ref ← π_θ: every K optimizer steps and/or when the KL moving average exceeds κ (SPEC §6.2).

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
        if int(every_steps) != every_steps or every_steps < 0:
            raise ValueError(f"RefreshSchedule every_steps (K) must be an integer ≥ 0, got {every_steps!r}")
        if not (math.isfinite(kl_threshold) and kl_threshold >= 0):
            raise ValueError(f"RefreshSchedule kl_threshold (κ) must be a finite number ≥ 0, got {kl_threshold!r}")
        if not (0.0 <= ema_decay < 1.0):
            raise ValueError(f"RefreshSchedule ema_decay must be in [0, 1), got {ema_decay!r}")
        if every_steps == 0 and kl_threshold == 0:
            raise ValueError("RefreshSchedule needs every_steps (K) > 0 and/or kl_threshold (κ) > 0")
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
        """Restore the counters, EMA and history. K, κ and d stay as configured (a resumed run may change them)."""
        missing = {"train_steps", "optimizer_steps", "steps_since_refresh", "kl_ema", "history"} - set(state)
        if missing:
            raise ValueError(f"RefreshSchedule state is missing keys {sorted(missing)}")
        self.state = ReferenceState(
            train_steps=int(state["train_steps"]),
            optimizer_steps=int(state["optimizer_steps"]),
            steps_since_refresh=int(state["steps_since_refresh"]),
            kl_ema=None if state["kl_ema"] is None else float(state["kl_ema"]),
            history=[dict(h) for h in state["history"]],
        )


def _reshard_fsdp2(module: torch.nn.Module) -> None:
    """Put every FSDP2 sub-module in its sharded state, so the registered parameters are the up-to-date shards."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - old torch
        return
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def copy_policy_weights(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """Overwrite ``dst``'s parameters and buffers with ``src``'s (π_ref ← π_θ), in place.

    Works for plain modules and FSDP/FSDP2-wrapped ones through torch's distributed state-dict API (sharded state
    dicts: each rank copies its own shards; collective when the layouts differ). Must be called on every rank.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    _reshard_fsdp2(src)
    _reshard_fsdp2(dst)
    with torch.no_grad():
        state = get_model_state_dict(src)
        result = set_model_state_dict(dst, state)
    missing = list(getattr(result, "missing_keys", []) or [])
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if missing or unexpected:
        raise RuntimeError(
            f"reference refresh: actor and reference models differ (missing in actor: {missing[:5]}, "
            f"unexpected: {unexpected[:5]}); both must be built from actor_rollout_ref.model"
        )


def _engine_module(training_worker: Any, what: str) -> torch.nn.Module:
    module = getattr(getattr(training_worker, "engine", None), "module", None)
    if not isinstance(module, torch.nn.Module):
        raise NotImplementedError(
            f"reference='periodic' copies weights between torch modules; the {what} engine "
            f"{type(getattr(training_worker, 'engine', None)).__name__} exposes none (supported: FSDP/FSDP2 engines, "
            "actor_rollout_ref.actor.strategy=fsdp|fsdp2)"
        )
    return module


# ---------------------------------------------------------------------------------------------------------------------
# 3. Worker integration: update_actor / save_checkpoint / load_checkpoint of ActorRolloutRefWorker
# ---------------------------------------------------------------------------------------------------------------------


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank() -> int:
    return torch.distributed.get_rank() if _dist_ready() else 0


def _barrier() -> None:
    if _dist_ready():
        torch.distributed.barrier()


def _all_reduce_sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if _dist_ready() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(t)  # CPU tensor: gloo (verl always adds a cpu:gloo backend)
    return t.tolist()


def _write_json_atomic(path: str, payload: dict) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class PeriodicReference:
    """Per-worker state of the ``periodic`` mode: the schedule and the refresh/save/load of the reference engine.

    ``actor`` / ``ref`` are verl ``TrainingWorker`` objects (``ActorRolloutRefWorker.actor`` / ``.ref``).
    """

    def __init__(self, schedule: RefreshSchedule, actor: Any, ref: Any):
        self.schedule = schedule
        self.actor = actor
        self.ref = ref
        self.optimizer_steps = 0  # optimizer steps of the actor engine since the counter was last reset
        self._count_optimizer_steps(actor.engine)

    def _count_optimizer_steps(self, engine: Any) -> None:
        """Count the actor engine's real optimizer steps (verl's ``BaseEngine.optimizer_step``, one per mini-batch,
        whatever the batch format or the mini-batch/epoch settings) with an instance-level wrapper."""
        step = engine.optimizer_step

        @functools.wraps(step)
        def optimizer_step(*args, **kwargs):
            self.optimizer_steps += 1
            return step(*args, **kwargs)

        engine.optimizer_step = optimizer_step

    @classmethod
    def from_settings(cls, settings: Any, actor: Any, ref: Any) -> "PeriodicReference":
        schedule = RefreshSchedule(settings.ref_refresh_steps, settings.ref_refresh_kl, settings.ref_kl_ema)
        return cls(schedule, actor, ref)

    def refresh(self) -> None:
        copy_policy_weights(_engine_module(self.actor, "actor"), _engine_module(self.ref, "reference"))

    def end_of_training_step(self, optimizer_steps: int, kl: Optional[float]) -> dict[str, float]:
        """Update the schedule, refresh the reference if due, and return the metrics of this step."""
        refreshed = self.schedule.update(kl, optimizer_steps)
        s = self.schedule.state
        seconds = 0.0
        if refreshed:
            start = time.perf_counter()
            self.refresh()
            seconds = time.perf_counter() - start
            if _rank() == 0:
                last = s.history[-1]
                print(
                    f"[rpg.reference] reference <- policy at training step {last['train_step']} "
                    f"(optimizer step {last['optimizer_step']}, reason={last['reason']}, kl_ema={last['kl_ema']}); "
                    f"refresh #{len(s.history)}",
                    flush=True,
                )
        metrics = {
            "ref_refreshed": float(refreshed),
            "ref_refresh_count": float(len(s.history)),
            "ref_steps_since_refresh": float(s.steps_since_refresh),
            "ref_refresh_time_s": seconds,
        }
        if kl is not None:
            metrics["ref_kl"] = float(kl)
        ema = s.history[-1]["kl_ema"] if refreshed else s.kl_ema
        if ema is not None:
            metrics["ref_kl_ema"] = float(ema)
        return {METRIC_PREFIX + k: v for k, v in metrics.items()}

    # checkpoints --------------------------------------------------------------------------------------------------
    def save(self, local_path: str, global_step: int) -> None:
        """Write ``<local_path>/rpg_reference/{state.json, ref_model/}`` (all ranks call; rank 0 writes the JSON)."""
        root = os.path.join(local_path, STATE_DIR)
        has_weights = self.schedule.refresh_count > 0
        if has_weights:
            self._save_ref_weights(os.path.join(root, REF_MODEL_DIR))
        if _rank() == 0:
            payload = {
                "version": STATE_VERSION,
                "global_step": int(global_step),
                "has_ref_weights": has_weights,
                "schedule": self.schedule.state_dict(),
            }
            _write_json_atomic(os.path.join(root, STATE_FILE), payload)
        _barrier()

    def load(self, local_path: str) -> bool:
        """Restore the schedule (and the refreshed reference weights) saved by `save`; False if there is none."""
        root = os.path.join(local_path, STATE_DIR)
        path = os.path.join(root, STATE_FILE)
        if not os.path.exists(path):
            logger.warning(
                "rpg.reference: no %s in the checkpoint %s (saved without reference='periodic'?): the reference "
                "restarts as the initial model with a fresh schedule",
                os.path.join(STATE_DIR, STATE_FILE), local_path,
            )
            return False
        with open(path) as f:
            payload = json.load(f)
        if payload.get("version") != STATE_VERSION:
            raise ValueError(f"{path}: unsupported rpg_reference state version {payload.get('version')!r}")
        self.schedule.load_state_dict(payload["schedule"])
        if payload["has_ref_weights"]:
            self._load_ref_weights(os.path.join(root, REF_MODEL_DIR))
        return True

    def _save_ref_weights(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        module = _engine_module(self.ref, "reference")
        _reshard_fsdp2(module)
        tmp = directory + ".tmp"
        if _rank() == 0 and os.path.exists(tmp):
            shutil.rmtree(tmp)
        _barrier()
        dcp.save(get_model_state_dict(module), checkpoint_id=tmp, no_dist=not _dist_ready())
        _barrier()
        if _rank() == 0:  # atomic switch: the complete directory appears under its final name or not at all
            if os.path.exists(directory):
                shutil.rmtree(directory)
            os.replace(tmp, directory)
        _barrier()

    def _load_ref_weights(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        module = _engine_module(self.ref, "reference")
        _reshard_fsdp2(module)
        state = get_model_state_dict(module)
        dcp.load(state, checkpoint_id=directory, no_dist=not _dist_ready())
        with torch.no_grad():
            set_model_state_dict(module, state)


def _policy_loss_cfg(worker: Any) -> Any:
    actor_cfg = worker.config.get("actor", None) if hasattr(worker.config, "get") else None
    return None if actor_cfg is None else actor_cfg.get("policy_loss", None)


def _periodic_reference(worker: Any) -> Optional[PeriodicReference]:
    """The worker's `PeriodicReference` (built on first use), or None unless ``reference == 'periodic'``."""
    cached = worker.__dict__.get("_rpg_periodic_reference", False)
    if cached is not False:
        return cached
    pl = _policy_loss_cfg(worker)
    ctl = None
    if pl is not None and pl.get("reference", "iterative") == "periodic" and getattr(worker, "actor", None) is not None:
        from rpg.config import rpg_settings

        settings = rpg_settings(worker.config.actor)
        if getattr(worker, "ref", None) is None:
            raise ValueError(
                "reference='periodic' refreshes the reference model in the actor's process, but this actor worker "
                f"(role={getattr(worker, 'role', '?')!r}) holds no reference model. It needs verl's fused "
                "'actor_rollout_ref' worker: set actor_rollout_ref.actor.use_kl_loss=True (kl_loss_coef=0), no LoRA "
                "(a LoRA reference is the adapter-free actor), and the hybrid engine (trainer.v1.trainer_mode=sync)."
            )
        ctl = PeriodicReference.from_settings(settings, worker.actor, worker.ref)
    worker.__dict__["_rpg_periodic_reference"] = ctl
    return ctl


def _wrap_update_actor(orig: Callable) -> Callable:
    if getattr(orig, _MARK, False):
        return orig

    @functools.wraps(orig)
    def update_actor(self, data, *args, **kwargs):
        ctl = _periodic_reference(self)
        if ctl is None:
            return orig(self, data, *args, **kwargs)
        ctl.optimizer_steps = 0
        _KL_METER.start()
        try:
            output = orig(self, data, *args, **kwargs)  # `data`: a TensorDict, or TransferQueue metadata (v1 trainer)
        finally:
            kl_sum, tokens = _KL_METER.stop()
        kl_sum, tokens = _all_reduce_sum([kl_sum, tokens])
        metrics = ctl.end_of_training_step(ctl.optimizer_steps, kl_sum / tokens if tokens > 0 else None)
        if isinstance(output, TensorDict) and "metrics" in output.keys():
            from verl.utils import tensordict_utils as tu

            merged = dict(tu.get(output, "metrics") or {})
            merged.update({k: [v] for k, v in metrics.items()})
            tu.assign_non_tensor(output, metrics=merged)
        return output

    setattr(update_actor, _MARK, True)
    return update_actor


def _wrap_save_checkpoint(orig: Callable) -> Callable:
    if getattr(orig, _MARK, False):
        return orig

    @functools.wraps(orig)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        result = orig(self, local_path, hdfs_path, global_step, max_ckpt_to_keep)
        ctl = _periodic_reference(self)
        if ctl is not None and local_path is not None:
            ctl.save(local_path, global_step)
        return result

    setattr(save_checkpoint, _MARK, True)
    return save_checkpoint


def _wrap_load_checkpoint(orig: Callable) -> Callable:
    if getattr(orig, _MARK, False):
        return orig

    @functools.wraps(orig)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        ctl = _periodic_reference(self)
        if ctl is not None and local_path is not None:
            ctl.load(local_path)  # before verl's load: it may delete the local checkpoint afterwards
        return orig(self, local_path, hdfs_path, del_local_after_load)

    setattr(load_checkpoint, _MARK, True)
    return load_checkpoint


# ---------------------------------------------------------------------------------------------------------------------
# install(): patch verl's modules when (or if already) imported
# ---------------------------------------------------------------------------------------------------------------------


def _patch_losses(module: Any) -> None:
    module.ppo_loss = _wrap_ppo_loss(module.ppo_loss)


def _patch_engine_workers(module: Any) -> None:
    module.ppo_loss = _wrap_ppo_loss(module.ppo_loss)  # the copy bound by `from ... import ppo_loss`
    cls = module.ActorRolloutRefWorker
    for name, wrap in (
        ("update_actor", _wrap_update_actor),
        ("save_checkpoint", _wrap_save_checkpoint),
        ("load_checkpoint", _wrap_load_checkpoint),
    ):
        setattr(cls, name, wrap(cls.__dict__[name]))


_PATCHES: dict[str, Callable[[Any], None]] = {_LOSSES_MODULE: _patch_losses, _WORKERS_MODULE: _patch_engine_workers}


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then applies our patch to the freshly executed module."""

    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[Any], None]):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_resource_reader, get_source, ...
        return getattr(self._loader, name)


class _PostImportPatcher(importlib.abc.MetaPathFinder):
    """A meta-path finder that only intercepts the modules in `_PATCHES` and wraps their loader."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


def install() -> None:
    """Install the adapter and the periodic-reference hooks (idempotent, imports nothing heavy).

    Modules of `_PATCHES` that are already imported are patched now; the others are patched by a post-import hook
    the moment they are imported. Safe to call any number of times, in any process.
    """
    if not any(isinstance(f, _PostImportPatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportPatcher())
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
