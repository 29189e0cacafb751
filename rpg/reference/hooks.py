"""The worker hooks: the per-mode state of the run-mode table (`rpg.modes`) inside verl's fused
actor+reference worker, for every row with ``worker_state`` (periodic, ema, adaptive).

verl has no hook for this, so `install()` wraps three methods of ``verl.workers.engine_workers.ActorRolloutRefWorker``
(after checking the verl version and their signatures with `rpg.compat`); each wrapper is a pass-through unless the
worker's own config selects a row with worker state, whose state class (`STATES`) it builds on first use:

* ``update_actor`` (one call = one training step = M·epochs optimizer steps, M mini-batches): opens one
  `rpg.reference.step.TrainingStep` around verl's update (each state's ``start_step`` says what it needs: the
  reference KL the ``ppo_loss`` adapter measures, the loss's KL, the step's β), all-reduces the step's four sums at
  once, then calls each state's ``end_step`` (refresh or blend the reference, update β) and adds their metrics
  (``actor/rpg/<name>``, the row's ``metrics``) to verl's;
* ``save_checkpoint``/``load_checkpoint``: each state saves/loads its own files next to verl's actor checkpoint
  (`rpg.reference.written`, `rpg.reference.adaptive_kl`), loading *before* verl's own load, which may delete the local
  checkpoint.

The class patch reaches the running workers because verl creates them inside its colocated ``WorkerDict``/
``FusedWorker`` (``verl.single_controller.ray.base``), which dispatch every remote call by attribute lookup on the
worker instance at call time; `install()` runs at ``import verl`` in every process whose ``RPG_INSTALL`` names
``periodic_reference`` (`rpg.install`, through the plugin entry point), before any worker exists.

Limits (clear errors, not silent): a mode that writes the reference needs the reference engine in the actor's process
(verl's fused ``actor_rollout_ref`` role, i.e. the default hybrid engine without LoRA); the weight copy goes through
torch's distributed state-dict API (FSDP2 and plain modules are tested on CPU; FSDP1 is expected to work but untested
here; Megatron and other engines raise). HDFS checkpoint copies (``default_hdfs_dir``) do not include its files.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from tensordict import TensorDict

from rpg.compat import SUPPORTED_VERL, marked_wrapper, require_signature, require_version
from rpg import modes
from rpg.reference.adaptive_kl import AdaptiveBeta
from rpg.reference.ema import EmaReference
from rpg.reference.periodic import PeriodicReference
from rpg.reference.ranks import all_reduce_sum
from rpg.reference.step import TrainingStep, running

__all__ = ["STATES", "check", "install", "installed", "worker_states"]

METRIC_PREFIX = "actor/rpg/"
WORKERS_MODULE = "verl.workers.engine_workers"
WHAT = "rpg's periodic-reference hooks on verl's ActorRolloutRefWorker (rpg/reference/hooks.py)"
MARK = "__rpg_periodic_reference_hook__"
#: the state class of every row with worker state (tests/reference/test_modes_on_cpu.py: one per such row)
STATES: dict[str, type] = {cls.row.name: cls for cls in (PeriodicReference, EmaReference, AdaptiveBeta)}
#: the worker attribute that caches each setting's state (None: the row has none)
ATTRIBUTES = {"reference": "_rpg_reference", "kl_control": "_rpg_kl_control"}


def _policy_loss_cfg(worker: Any) -> Any:
    actor_cfg = worker.config.get("actor", None) if hasattr(worker.config, "get") else None
    return None if actor_cfg is None else actor_cfg.get("policy_loss", None)


def _state(worker: Any, row: modes.Mode) -> Any:
    """The worker's state of `row` (built on first use from the worker's settings), or None."""
    attribute = ATTRIBUTES[row.setting]
    cached = worker.__dict__.get(attribute, False)
    if cached is not False:
        return cached
    state = None
    if row.worker_state and getattr(worker, "actor", None) is not None:
        from rpg.loss_config import rpg_settings

        if row.writes_reference and getattr(worker, "ref", None) is None:
            raise ValueError(
                f"reference={row.name!r} writes the reference model in the actor's process, but this actor worker "
                f"(role={getattr(worker, 'role', '?')!r}) holds no reference model. It needs verl's fused "
                "'actor_rollout_ref' worker: set actor_rollout_ref.actor.use_kl_loss=True (kl_loss_coef=0), no LoRA "
                "(a LoRA reference is the adapter-free actor), and the hybrid engine (trainer.v1.trainer_mode=sync)."
            )
        settings = rpg_settings(worker.config.actor)
        state = STATES[row.name].from_settings(settings, worker.actor, getattr(worker, "ref", None))
    worker.__dict__[attribute] = state
    return state


def worker_states(worker: Any) -> list:
    """The states of the rows the worker's policy loss selects that have one (reference first, then KL control)."""
    pl = _policy_loss_cfg(worker)
    if pl is None:
        return []
    return [s for row in modes.selected(pl) if (s := _state(worker, row)) is not None]


#: a hook factory made idempotent: a method that carries the hook is returned as is; the new wrapper keeps the
#: original's metadata (verl's ``@register`` dispatch information) and carries `MARK`
_hook = marked_wrapper(MARK)


@_hook
def _wrap_update_actor(orig: Callable) -> Callable:
    def update_actor(self, data, *args, **kwargs):
        states = worker_states(self)
        if not states:
            return orig(self, data, *args, **kwargs)
        step = TrainingStep()
        for state in states:
            state.start_step(step)
        with running(step):
            output = orig(self, data, *args, **kwargs)  # `data`: a TensorDict, or TransferQueue metadata (v1 trainer)
        ref_sum, ref_tokens, loss_sum, loss_tokens = all_reduce_sum(step.sums())  # one all-reduce per step
        ref_kl = ref_sum / ref_tokens if ref_tokens > 0 else None
        loss_kl = loss_sum / loss_tokens if loss_tokens > 0 else None
        metrics = {}
        for state in states:
            got = state.end_step(ref_kl, loss_kl)
            if not set(got) <= set(state.row.metrics):
                raise RuntimeError(f"{type(state).__name__} logged {sorted(set(got) - set(state.row.metrics))}, not "
                                   f"in its row's metrics (rpg/modes.py)")  # fmt: skip
            metrics.update({METRIC_PREFIX + k: v for k, v in got.items()})
        if isinstance(output, TensorDict) and "metrics" in output.keys():
            from verl.utils import tensordict_utils as tu

            merged = dict(tu.get(output, "metrics") or {})
            merged.update({k: [v] for k, v in metrics.items()})
            tu.assign_non_tensor(output, metrics=merged)
        return output

    return update_actor


@_hook
def _wrap_save_checkpoint(orig: Callable) -> Callable:
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        result = orig(self, local_path, hdfs_path, global_step, max_ckpt_to_keep)
        if local_path is not None:
            for state in worker_states(self):
                state.save(local_path, global_step)
        return result

    return save_checkpoint


@_hook
def _wrap_load_checkpoint(orig: Callable) -> Callable:
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        if local_path is not None:
            for state in worker_states(self):
                state.load(local_path)  # before verl's load: it may delete the local checkpoint afterwards
        return orig(self, local_path, hdfs_path, del_local_after_load)

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
    """True when the three methods of verl's ``ActorRolloutRefWorker`` carry the hooks."""
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
