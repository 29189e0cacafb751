"""The periodic and EMA references and the adaptive β inside verl's fused actor+reference worker: refresh or blend,
controller update, metrics, checkpoint and resume.

``reference='ema'`` runs the same machinery as ``periodic`` with the schedule K = ``ref_ema_period`` (no κ) and, on
an update, the blend π_ref ← τ·π_ref + (1 − τ)·π_θ on each rank's own fp32 shards (`rpg.reference.weights`) instead of
the copy; its metrics are ``actor/rpg/ref_ema_updated``, ``ref_ema_update_count``, ``ref_ema_steps_since_update``,
``ref_ema_time_s``, ``ref_ema_decay`` and ``ref_kl``; its checkpoint is ``rpg_reference/`` as below (state.json
records the mode). ``kl_control='adaptive'`` (any reference): the ``update_actor`` hook makes the worker's
`rpg.reference.adaptive_kl.AdaptiveKLCoef` the β the losses read, collects the losses' KL estimate, all-reduces it
with the reference KL (one all-reduce) and updates β once per training step (metrics ``actor/rpg/kl_coef``: the β of
this step, ``kl_coef_next``, ``kl_ctrl_kl``); ``global_step_N/actor/rpg_kl_control.json`` (rank 0, atomic; read by
rank 0 on resume and broadcast) stores it.

With ``reference='periodic'`` the reference weights are overwritten with the actor's on the schedule of
`rpg.reference.schedule.RefreshSchedule`. verl has no hook for this, so `install()` wraps three methods of
``verl.workers.engine_workers.ActorRolloutRefWorker`` (after checking the verl version and their signatures with
`rpg.compat`); each wrapper is a pass-through unless the worker's own config selects ``periodic``:

* ``update_actor`` (one call = one training step = M·epochs optimizer steps, M mini-batches): counts the actor
  engine's ``optimizer_step`` calls (whatever the batch format or mini-batch/epoch settings), measures the token KL
  to the reference during the update (`rpg.reference.adapter.KL_METER`, fed by the ``ppo_loss`` adapter), feeds both
  to the schedule and, on a refresh, copies the actor's weights into the fused reference engine
  (`copy_policy_weights`). verl computes ``ref_log_prob`` once per training step *before* the update, so the
  reference can only change between training steps: a refresh fires at the end of the first training step after
  which ≥ K optimizer steps have passed (exactly every K optimizer steps when M·epochs divides K), or after which the
  KL moving average exceeds κ. Metrics: ``actor/rpg/ref_refreshed`` (1 on a refresh step), ``actor/rpg/ref_kl``,
  ``actor/rpg/ref_kl_ema``, ``actor/rpg/ref_refresh_count``, ``actor/rpg/ref_steps_since_refresh``,
  ``actor/rpg/ref_refresh_time_s`` (seconds spent copying, 0 without a refresh); rank 0 also prints one line per
  refresh with the step numbers.
* ``save_checkpoint``/``load_checkpoint``: next to verl's actor checkpoint (``global_step_N/actor/``)
  ``rpg_reference/state.json`` stores the schedule (steps since the last refresh, KL EMA, refresh history) and, once
  a refresh has happened, ``rpg_reference/ref_model/`` stores the reference weights (torch.distributed.checkpoint
  format). Both are written atomically (temp + rename). A resumed run therefore uses the same reference and
  refreshes at exactly the same steps as an uninterrupted one. They are read *before* verl's own load, which may
  delete the local checkpoint. A checkpoint without this state (saved with another reference mode), a corrupt state
  file or a non-finite KL average is refused, naming the file: silently restarting from the initial model would
  break the resume promise.

The class patch reaches the running workers because verl creates them inside its colocated ``WorkerDict``/
``FusedWorker`` (``verl.single_controller.ray.base``), which dispatch every remote call by attribute lookup on the
worker instance at call time; `install()` runs at ``import verl`` in every process whose ``RPG_INSTALL`` names
``periodic_reference`` (`rpg.install`, through the plugin entry point), before any worker exists.

The KL measured for κ is the importance-weighted k3 estimate of KL(π_θ‖π_ref) per token on π_old samples,
``w·k3(π_ref/π_θ)`` (`rpg.reference.adapter.token_kl_to_reference`), evaluated at the current θ of each micro-batch,
token-averaged over the whole training step and all data-parallel ranks. The moving average is updated once per
training step, ``ema ← d·ema + (1−d)·kl`` (``d = ref_kl_ema``; the first value after a (re)start is the measured KL
itself), and restarts at a refresh because the reference changed.

Limits (clear errors, not silent): ``periodic`` needs the reference engine in the actor's process (verl's fused
``actor_rollout_ref`` role, i.e. the default hybrid engine without LoRA); the weight copy goes through torch's
distributed state-dict API (FSDP2 and plain modules are tested on CPU; FSDP1 is expected to work but untested here;
Megatron and other engines raise). HDFS checkpoint copies (``default_hdfs_dir``) do not include ``rpg_reference/``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import sys
import time
from typing import Any, Callable, Optional

import torch
from tensordict import TensorDict

from rpg.atomic import atomic_write_json
from rpg.compat import SUPPORTED_VERL, require_signature, require_version
from rpg.reference import adaptive_kl
from rpg.reference.adapter import KL_METER
from rpg.reference.schedule import RefreshSchedule
from rpg.reference.weights import blend_policy_weights, copy_policy_weights, engine_module, reshard_fsdp2

__all__ = ["PeriodicReference", "check", "copy_policy_weights", "install", "installed"]

logger = logging.getLogger(__name__)

STATE_DIR = "rpg_reference"
STATE_FILE = "state.json"
REF_MODEL_DIR = "ref_model"
STATE_VERSION = 1
METRIC_PREFIX = "actor/rpg/"

WORKERS_MODULE = "verl.workers.engine_workers"
WHAT = "rpg's periodic-reference hooks on verl's ActorRolloutRefWorker (rpg/reference/periodic.py)"
MARK = "__rpg_periodic_reference_hook__"
VERIFY_ENV = "RPG_SMOKE_VERIFY_REFRESH"  # rpg.smoke.VERIFY_REFRESH_ENV: check the copy after each refresh


_reshard_fsdp2 = reshard_fsdp2  # the names tests and older callers use
_engine_module = engine_module
def verify_copy(src: torch.nn.Module, dst: torch.nn.Module) -> tuple[int, float]:
    """Check, on this rank, that every local shard of ``dst`` equals ``src``'s (cast to ``dst``'s dtype, compared on
    ``dst``'s device: e.g. the offloaded reference's CPU memory). Returns (tensors compared, float64 checksum of the
    reference's local shards); raises RuntimeError naming the first tensor that differs."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    with torch.no_grad():
        a, b = get_model_state_dict(src), get_model_state_dict(dst)
        if a.keys() != b.keys():
            raise RuntimeError(f"reference refresh check: actor and reference state dicts differ in keys "
                               f"{sorted(a.keys() ^ b.keys())[:5]}")  # fmt: skip
        checksum = 0.0
        for name in a:
            x, y = local(a[name]), local(b[name])
            if not torch.equal(x.to(device=y.device, dtype=y.dtype), y):
                raise RuntimeError(f"reference refresh check: rank {_rank()}'s shard of {name} differs from the actor's "
                                   "after the refresh")  # fmt: skip
            checksum += float(y.double().sum())
    return len(a), checksum




# ---------------------------------------------------------------------------------------------------------------------
# Worker glue: update_actor / save_checkpoint / load_checkpoint of ActorRolloutRefWorker
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


class PeriodicReference:
    """Per-worker state of the ``periodic`` and ``ema`` modes: the schedule and the refresh (copy, or EMA blend with
    ``ema_decay`` τ) / save / load of the reference engine.

    ``actor`` / ``ref`` are verl ``TrainingWorker`` objects (``ActorRolloutRefWorker.actor`` / ``.ref``).
    """

    def __init__(self, schedule: RefreshSchedule, actor: Any, ref: Any, ema_decay: Optional[float] = None):
        self.schedule = schedule
        self.actor = actor
        self.ref = ref
        self.ema_decay = ema_decay  # None: periodic (copy); τ: EMA (blend)
        self.mode = "periodic" if ema_decay is None else "ema"
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
        if settings.reference == "ema":  # the EMA update period is the periodic reference's K, in optimizer steps
            return cls(RefreshSchedule(settings.ref_ema_period), actor, ref, ema_decay=settings.ref_ema_decay)
        schedule = RefreshSchedule(settings.ref_refresh_steps, settings.ref_refresh_kl, settings.ref_kl_ema)
        return cls(schedule, actor, ref)

    def refresh(self) -> None:
        actor, ref = engine_module(self.actor, "actor"), engine_module(self.ref, "reference")
        if self.ema_decay is None:
            copy_policy_weights(actor, ref)
        else:
            blend_policy_weights(actor, ref, self.ema_decay)

    def end_of_training_step(self, optimizer_steps: int, kl: Optional[float]) -> dict[str, float]:
        """Update the schedule, refresh the reference if due, and return the metrics of this step."""
        refreshed = self.schedule.update(kl, optimizer_steps)
        s = self.schedule.state
        seconds = 0.0
        if refreshed:
            start = time.perf_counter()
            self.refresh()
            seconds = time.perf_counter() - start
            if os.environ.get(VERIFY_ENV) == "1" and self.mode == "periodic":  # SMOKE=1 (rpg/smoke.py): every rank
                n, checksum = verify_copy(engine_module(self.actor, "actor"), engine_module(self.ref, "reference"))
                print(f"[rpg.reference] rank {_rank()}: reference = actor after the refresh at training step "
                      f"{s.history[-1]['train_step']} ({n} shard tensors equal, checksum {checksum:.9e})", flush=True)
            if _rank() == 0 and self.mode == "periodic":
                last = s.history[-1]
                print(
                    f"[rpg.reference] reference <- policy at training step {last['train_step']} "
                    f"(optimizer step {last['optimizer_step']}, reason={last['reason']}, kl_ema={last['kl_ema']}); "
                    f"refresh #{len(s.history)}",
                    flush=True,
                )
        if self.mode == "ema":
            metrics = {
                "ref_ema_updated": float(refreshed),
                "ref_ema_update_count": float(len(s.history)),
                "ref_ema_steps_since_update": float(s.steps_since_refresh),
                "ref_ema_time_s": seconds,
                "ref_ema_decay": float(self.ema_decay),
            }
            if kl is not None:
                metrics["ref_kl"] = float(kl)
            return {METRIC_PREFIX + k: v for k, v in metrics.items()}
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
                "reference": self.mode,
                "global_step": int(global_step),
                "has_ref_weights": has_weights,
                "schedule": self.schedule.state_dict(),
            }
            atomic_write_json(os.path.join(root, STATE_FILE), payload, indent=2, sort_keys=True)
        _barrier()

    def load(self, local_path: str) -> None:
        """Restore the schedule (and the refreshed reference weights) saved by `save`.

        Raises RuntimeError when the checkpoint has no reference state (saved with another reference mode: resuming
        would silently restart the reference from the initial model), ValueError naming the file when it is corrupt.
        """
        root = os.path.join(local_path, STATE_DIR)
        path = os.path.join(root, STATE_FILE)
        if not os.path.exists(path):
            raise RuntimeError(
                f"reference={self.mode!r} cannot resume from {local_path}: it has no {path} (the checkpoint was saved "
                f"with another policy_loss.reference, or without rpg-verl), so the reference model and its refresh "
                f"schedule are unknown. Resume it with the reference= setting it was trained with, or start a new run "
                f"from its weights with trainer.resume_mode=disable (actor_rollout_ref.model.path=<exported model>)."
            )
        try:
            with open(path) as f:
                payload = json.load(f, parse_constant=_reject_constant)
            if not isinstance(payload, dict) or payload.get("version") != STATE_VERSION:
                version = payload.get("version") if isinstance(payload, dict) else None
                raise ValueError(f"unsupported state version {version!r} (this rpg-verl reads {STATE_VERSION})")
            saved_mode = payload.get("reference", "periodic")  # files of rpg-verl before the EMA reference: periodic
            if saved_mode != self.mode:
                raise ValueError(
                    f"saved with reference={saved_mode!r}, resumed with reference={self.mode!r}: resume with the mode "
                    f"it was trained with, or start a new run from its weights (trainer.resume_mode=disable)"
                )
            self.schedule.load_state_dict(payload["schedule"])
            has_weights = payload["has_ref_weights"]
            if not isinstance(has_weights, bool):
                raise ValueError(f"has_ref_weights={has_weights!r} must be true or false")
        except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"corrupt or mismatched {self.mode}-reference state {path}: {e}") from e
        if has_weights:
            self._load_ref_weights(os.path.join(root, REF_MODEL_DIR))

    def _save_ref_weights(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        module = engine_module(self.ref, "reference")
        reshard_fsdp2(module)
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

        module = engine_module(self.ref, "reference")
        reshard_fsdp2(module)
        state = get_model_state_dict(module)
        dcp.load(state, checkpoint_id=directory, no_dist=not _dist_ready())
        with torch.no_grad():
            set_model_state_dict(module, state)


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name} (kl_ema must be null or a finite number ≥ 0)")


def _policy_loss_cfg(worker: Any) -> Any:
    actor_cfg = worker.config.get("actor", None) if hasattr(worker.config, "get") else None
    return None if actor_cfg is None else actor_cfg.get("policy_loss", None)


def _periodic_reference(worker: Any) -> Optional[PeriodicReference]:
    """The worker's `PeriodicReference` (built on first use), or None unless ``reference`` is periodic or ema."""
    cached = worker.__dict__.get("_rpg_periodic_reference", False)
    if cached is not False:
        return cached
    pl = _policy_loss_cfg(worker)
    ctl = None
    mode = pl.get("reference", None) if pl is not None else None
    if mode in ("periodic", "ema") and getattr(worker, "actor", None) is not None:
        from rpg.loss_config import rpg_settings

        settings = rpg_settings(worker.config.actor)
        if getattr(worker, "ref", None) is None:
            raise ValueError(
                f"reference={mode!r} writes the reference model in the actor's process, but this actor worker "
                f"(role={getattr(worker, 'role', '?')!r}) holds no reference model. It needs verl's fused "
                "'actor_rollout_ref' worker: set actor_rollout_ref.actor.use_kl_loss=True (kl_loss_coef=0), no LoRA "
                "(a LoRA reference is the adapter-free actor), and the hybrid engine (trainer.v1.trainer_mode=sync)."
            )
        ctl = PeriodicReference.from_settings(settings, worker.actor, worker.ref)
    worker.__dict__["_rpg_periodic_reference"] = ctl
    return ctl


KL_CONTROL_FILE = "rpg_kl_control.json"


def _kl_controller(worker: Any) -> Optional[adaptive_kl.AdaptiveKLCoef]:
    """The worker's adaptive-β controller (built on first use), or None unless ``kl_control == 'adaptive'``."""
    cached = worker.__dict__.get("_rpg_kl_controller", False)
    if cached is not False:
        return cached
    pl = _policy_loss_cfg(worker)
    ctl = None
    if pl is not None and pl.get("kl_control", None) == "adaptive" and getattr(worker, "actor", None) is not None:
        from rpg.loss_config import rpg_settings

        settings = rpg_settings(worker.config.actor)
        ctl = adaptive_kl.AdaptiveKLCoef(settings.kl_coef, settings.kl_target, settings.kl_horizon)
    worker.__dict__["_rpg_kl_controller"] = ctl
    return ctl


def save_kl_control(ctl: adaptive_kl.AdaptiveKLCoef, local_path: str, global_step: int) -> None:
    """Rank 0 writes ``<local_path>/rpg_kl_control.json`` (atomically; floats round-trip exactly through JSON)."""
    if _rank() == 0:
        payload = {"version": STATE_VERSION, "global_step": int(global_step), "controller": ctl.state_dict()}
        atomic_write_json(os.path.join(local_path, KL_CONTROL_FILE), payload, indent=2, sort_keys=True)
    _barrier()


def load_kl_control(ctl: adaptive_kl.AdaptiveKLCoef, local_path: str) -> None:
    """Rank 0 reads the controller state saved by `save_kl_control` and broadcasts it (only rank 0's node needs the
    file); every rank raises the same error when it is missing (saved with kl_control='fixed') or corrupt."""
    path = os.path.join(local_path, KL_CONTROL_FILE)
    message: list = [None]
    if _rank() == 0:
        try:
            with open(path) as f:
                payload = json.load(f, parse_constant=_reject_constant)
            if not isinstance(payload, dict) or payload.get("version") != STATE_VERSION:
                raise ValueError(f"unsupported state version (this rpg-verl reads {STATE_VERSION})")
            message[0] = ("ok", payload["controller"])
        except FileNotFoundError:
            message[0] = ("missing", None)
        except (ValueError, KeyError, TypeError) as e:
            message[0] = ("corrupt", str(e))
    if _dist_ready() and torch.distributed.get_world_size() > 1:
        torch.distributed.broadcast_object_list(message, src=0)
    status, value = message[0]
    if status == "missing":
        raise RuntimeError(
            f"kl_control='adaptive' cannot resume from {local_path}: it has no {path} (the checkpoint was saved with "
            "kl_control='fixed', or without rpg-verl), so β at that step is unknown. Resume with the kl_control it "
            "was trained with, or start a new run from its weights with trainer.resume_mode=disable."
        )
    try:
        if status == "corrupt":
            raise ValueError(value)
        ctl.load_state_dict(value)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"corrupt adaptive-β state {path}: {e}") from e


def _end_of_step_kl_control(ctl: adaptive_kl.AdaptiveKLCoef, kl_sum: float, tokens: float) -> dict[str, float]:
    used = ctl.value
    kl = kl_sum / tokens if tokens > 0 else None
    ctl.update(kl)
    metrics = {"kl_coef": used, "kl_coef_next": ctl.value}
    if kl is not None:
        metrics["kl_ctrl_kl"] = kl
    return {METRIC_PREFIX + k: v for k, v in metrics.items()}


def _wrap_update_actor(orig: Callable) -> Callable:
    if getattr(orig, MARK, False):
        return orig

    @functools.wraps(orig)
    def update_actor(self, data, *args, **kwargs):
        ctl, beta = _periodic_reference(self), _kl_controller(self)
        if ctl is None and beta is None:
            return orig(self, data, *args, **kwargs)
        if ctl is not None:
            ctl.optimizer_steps = 0
            KL_METER.start()
        if beta is not None:
            adaptive_kl.activate(beta)  # the β the losses read during this step
            adaptive_kl.KL_OBSERVER.start()
        try:
            output = orig(self, data, *args, **kwargs)  # `data`: a TensorDict, or TransferQueue metadata (v1 trainer)
        finally:
            kl_sum, tokens = KL_METER.stop() if ctl is not None else (0.0, 0.0)
            beta_kl_sum, beta_tokens = adaptive_kl.KL_OBSERVER.stop() if beta is not None else (0.0, 0.0)
        kl_sum, tokens, beta_kl_sum, beta_tokens = _all_reduce_sum([kl_sum, tokens, beta_kl_sum, beta_tokens])
        metrics = {}
        if ctl is not None:
            metrics.update(ctl.end_of_training_step(ctl.optimizer_steps, kl_sum / tokens if tokens > 0 else None))
        if beta is not None:
            metrics.update(_end_of_step_kl_control(beta, beta_kl_sum, beta_tokens))
        if isinstance(output, TensorDict) and "metrics" in output.keys():
            from verl.utils import tensordict_utils as tu

            merged = dict(tu.get(output, "metrics") or {})
            merged.update({k: [v] for k, v in metrics.items()})
            tu.assign_non_tensor(output, metrics=merged)
        return output

    setattr(update_actor, MARK, True)
    return update_actor


def _wrap_save_checkpoint(orig: Callable) -> Callable:
    if getattr(orig, MARK, False):
        return orig

    @functools.wraps(orig)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        result = orig(self, local_path, hdfs_path, global_step, max_ckpt_to_keep)
        ctl, beta = _periodic_reference(self), _kl_controller(self)
        if ctl is not None and local_path is not None:
            ctl.save(local_path, global_step)
        if beta is not None and local_path is not None:
            save_kl_control(beta, local_path, global_step)
        return result

    setattr(save_checkpoint, MARK, True)
    return save_checkpoint


def _wrap_load_checkpoint(orig: Callable) -> Callable:
    if getattr(orig, MARK, False):
        return orig

    @functools.wraps(orig)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        ctl, beta = _periodic_reference(self), _kl_controller(self)
        if ctl is not None and local_path is not None:
            ctl.load(local_path)  # before verl's load: it may delete the local checkpoint afterwards
        if beta is not None and local_path is not None:
            load_kl_control(beta, local_path)
        return orig(self, local_path, hdfs_path, del_local_after_load)

    setattr(load_checkpoint, MARK, True)
    return load_checkpoint


# ---------------------------------------------------------------------------------------------------------------------
# install(): wrap the three methods of verl's ActorRolloutRefWorker, guarded by version and signature
# ---------------------------------------------------------------------------------------------------------------------
WORKER_METHODS: dict[str, tuple[tuple[str, ...], Callable[[Callable], Callable]]] = {
    "update_actor": (("self", "data"), _wrap_update_actor),
    "save_checkpoint": (("self", "local_path", "hdfs_path", "global_step", "max_ckpt_to_keep"), _wrap_save_checkpoint),
    "load_checkpoint": (("self", "local_path", "hdfs_path", "del_local_after_load"), _wrap_load_checkpoint),
}


def installed() -> bool:
    """True when the three methods of verl's ``ActorRolloutRefWorker`` carry the periodic-reference hooks."""
    module = sys.modules.get(WORKERS_MODULE)
    cls = getattr(module, "ActorRolloutRefWorker", None)
    return cls is not None and all(getattr(cls.__dict__.get(n), MARK, False) for n in WORKER_METHODS)


def _unwrapped() -> tuple[type, list[str]]:
    """verl's ``ActorRolloutRefWorker`` and the names of its methods not hooked yet (imports verl's worker module)."""
    import verl.workers.engine_workers as workers

    cls = workers.ActorRolloutRefWorker
    return cls, [n for n in WORKER_METHODS if not getattr(cls.__dict__[n], MARK, False)]


def check() -> None:
    """Raise RuntimeError if `install` would wrap a method of an unsupported verl version or signature."""
    cls, todo = _unwrapped()
    if todo:
        require_version("verl", SUPPORTED_VERL, WHAT)
    for name in todo:
        require_signature(cls.__dict__[name], WORKER_METHODS[name][0], WHAT)


def install() -> None:
    """Wrap ``update_actor``/``save_checkpoint``/``load_checkpoint`` of verl's ``ActorRolloutRefWorker`` (idempotent;
    verl's ``@register`` dispatch metadata is kept), after `check`: nothing is patched if it fails."""
    check()
    cls, todo = _unwrapped()
    for name in todo:
        setattr(cls, name, WORKER_METHODS[name][1](cls.__dict__[name]))
