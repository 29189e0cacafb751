"""The worker hooks: the per-mode state of the run-mode table (`rpg.modes`) inside verl's fused
actor+reference worker, for every row with ``worker_state`` (periodic, ema, adaptive).

verl has no hook for this, so this module's pieces (`PIECES`) run in four methods of
``verl.workers.engine_workers.ActorRolloutRefWorker``, hooked by the table of patch points (`rpg.patches`, with its
version and signature guards) for ``RPG_INSTALL=worker_hooks``; each piece is a pass-through unless the worker's own
config selects a row with worker state, whose state class (`STATES`) it builds on first use:

* ``update_actor`` (one call = one training step = M·epochs optimizer steps, M mini-batches): opens one
  `rpg.reference.step.TrainingStep` around verl's update (each state's ``start_step`` says what it needs: the
  reference KL the ``ppo_loss`` adapter measures, the loss's KL, the step's β), all-reduces the step's four sums at
  once, then calls each state's ``end_step`` (refresh or blend the reference, update β) and adds their metrics
  (``actor/rpg/<name>``, the row's ``metrics``) to verl's;
* ``compute_log_prob``: in a LoRA run verl's reference pass is this call with ``no_lora_adapter=True``; for the
  periodic reference it runs with the snapshot of the policy's adapter in place of the adapter
  (`rpg.reference.lora.LoraPeriodicReference.reference_pass`, docs/reference-modes.md#lora); a pass-through otherwise;
* ``save_checkpoint``/``load_checkpoint``: each state saves/loads its own files next to verl's actor checkpoint
  (`rpg.reference.written`, `rpg.reference.adaptive_kl`), loading *before* verl's own load, which may delete the local
  checkpoint.

The class patch reaches the running workers because verl creates them inside its colocated ``WorkerDict``/
``FusedWorker`` (``verl.single_controller.ray.base``), which dispatch every remote call by attribute lookup on the
worker instance at call time; `rpg.install` hooks them at ``import verl`` in every process whose ``RPG_INSTALL`` names
``worker_hooks`` (through the plugin entry point), before any worker exists.

Limits (clear errors, not silent): a mode that writes the reference needs the reference engine in the actor's process
(verl's fused ``actor_rollout_ref`` role, i.e. the default hybrid engine), or, in a LoRA run, the actor's adapter
(`LORA_STATES`: periodic; ema is refused with its reason, `rpg.reference.lora_modes.EMA_REFUSAL`); the weight copy goes
through torch's distributed state-dict API (FSDP2 and plain modules are tested on CPU; FSDP1 is expected to work but
untested here; Megatron and other engines raise). HDFS checkpoint copies (``default_hdfs_dir``) do not include its
files.
"""

from __future__ import annotations

from typing import Any, Callable

from tensordict import TensorDict

from rpg import modes
from rpg.preflight.lora_config import lora_settings
from rpg.reference.adaptive_kl import AdaptiveBeta
from rpg.reference.ema import EmaReference
from rpg.reference.lora import LoraPeriodicReference, pop_reference_pass_flag, reference_pass_flag
from rpg.reference.lora_modes import lora_reference
from rpg.reference.periodic import PeriodicReference
from rpg.reference.ranks import all_reduce_sum
from rpg.reference.step import TrainingStep, running

__all__ = ["PIECES", "STATES", "worker_states"]

METRIC_PREFIX = "actor/rpg/"
#: the state class of every row with worker state (tests/reference/test_modes_on_cpu.py: one per such row)
STATES: dict[str, type] = {cls.row.name: cls for cls in (PeriodicReference, EmaReference, AdaptiveBeta)}
#: the state class, in a LoRA run, of every row that writes the reference and runs with LoRA (rpg.reference.lora_modes)
LORA_STATES: dict[str, type] = {cls.row.name: cls for cls in (LoraPeriodicReference,)}
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
        from rpg.loss_config import rpg_settings  # imports verl: not while verl loads this module (rpg.patches)

        settings = rpg_settings(worker.config.actor)
        if row.writes_reference and _lora_run(worker):
            state = _lora_state(row).from_settings(settings, worker.actor)
        elif row.writes_reference and getattr(worker, "ref", None) is None:
            raise ValueError(
                f"reference={row.name!r} writes the reference model in the actor's process, but this actor worker "
                f"(role={getattr(worker, 'role', '?')!r}) holds no reference model. It needs verl's fused "
                "'actor_rollout_ref' worker: set actor_rollout_ref.actor.use_kl_loss=True (kl_loss_coef=0) and the "
                "hybrid engine (trainer.v1.trainer_mode=sync)."
            )
        else:
            state = STATES[row.name].from_settings(settings, worker.actor, getattr(worker, "ref", None))
    worker.__dict__[attribute] = state
    return state


def _lora_run(worker: Any) -> bool:
    """verl's ``ref_in_actor``: the worker's model has a LoRA adapter (`rpg.preflight.lora_config`)."""
    return lora_settings({"actor_rollout_ref": worker.config}).enabled


def _lora_state(row: modes.Mode) -> type:
    """The LoRA state class of `row`; ValueError with the reason for a row that cannot run with LoRA."""
    refusal = lora_reference(row.name).refusal
    if refusal or row.name not in LORA_STATES:
        raise ValueError(f"reference={row.name!r} cannot run with LoRA: {refusal or 'no LoRA state'}")
    return LORA_STATES[row.name]


def worker_states(worker: Any) -> list:
    """The states of the rows the worker's policy loss selects that have one (reference first, then KL control)."""
    pl = _policy_loss_cfg(worker)
    if pl is None:
        return []
    return [s for row in modes.selected(pl) if (s := _state(worker, row)) is not None]


def update_actor(call: Callable, self, data, *args, **kwargs):
    """The piece of ``update_actor`` (`rpg.patches`): one `TrainingStep` around verl's update, its sums all-reduced
    once, each state's ``end_step``, and their metrics (``actor/rpg/<name>``) added to verl's."""
    states = worker_states(self)
    if not states:
        return call(self, data, *args, **kwargs)
    step = TrainingStep()
    for state in states:
        state.start_step(step)
    with running(step):
        output = call(self, data, *args, **kwargs)  # `data`: a TensorDict, or TransferQueue metadata (v1 trainer)
    ref_sum, ref_tokens, loss_sum, loss_tokens = all_reduce_sum(step.sums())  # one all-reduce per step
    ref_kl = ref_sum / ref_tokens if ref_tokens > 0 else None
    loss_kl = loss_sum / loss_tokens if loss_tokens > 0 else None
    metrics = {}
    for state in states:
        metrics.update(_metrics(state, state.end_step(ref_kl, loss_kl)))
    if isinstance(output, TensorDict) and "metrics" in output.keys():
        _add_metrics(output, metrics)
    return output


def _metrics(state: Any, got: dict) -> dict:
    """A state's step metrics under verl's names (``actor/rpg/<name>``); RuntimeError for one not in its row."""
    unknown = sorted(set(got) - set(state.row.metrics))
    if unknown:
        raise RuntimeError(f"{type(state).__name__} logged {unknown}, not in its row's metrics (rpg/modes.py)")
    return {METRIC_PREFIX + k: v for k, v in got.items()}


def _add_metrics(output: TensorDict, metrics: dict) -> None:
    from verl.utils import tensordict_utils as tu  # verl at the first call: importing this module imports none

    merged = dict(tu.get(output, "metrics") or {})
    merged.update({k: [v] for k, v in metrics.items()})
    tu.assign_non_tensor(output, metrics=merged)


def compute_log_prob(call: Callable, self, data, *args, **kwargs):
    """The piece of ``compute_log_prob``: verl's reference pass of a LoRA run (``no_lora_adapter=True``) with the
    snapshot of the policy's adapter when the reference is a LoRA snapshot (the flag removed, so that verl keeps the
    adapter on; the policy's adapter restored after the call); any other call unchanged."""
    pl = _policy_loss_cfg(self)
    if pl is None or not reference_pass_flag(data):
        return call(self, data, *args, **kwargs)
    state = _state(self, modes.selected(pl)[0])  # the reference row's state
    if not getattr(state, "lora_snapshot", False):
        return call(self, data, *args, **kwargs)  # frozen: verl's adapter-free base
    pop_reference_pass_flag(data)
    with state.reference_pass():
        return call(self, data, *args, **kwargs)


def save_checkpoint(call: Callable, self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
    """The piece of ``save_checkpoint``: verl's save, then each state's files next to it."""
    result = call(self, local_path, hdfs_path, global_step, max_ckpt_to_keep)
    if local_path is not None:
        for state in worker_states(self):
            state.save(local_path, global_step)
    return result


def load_checkpoint(call: Callable, self, local_path, hdfs_path=None, del_local_after_load=False):
    """The piece of ``load_checkpoint``: each state's files, then verl's load (which may delete the local copy)."""
    if local_path is not None:
        for state in worker_states(self):
            state.load(local_path)
    return call(self, local_path, hdfs_path, del_local_after_load)


#: the pieces of `rpg.patches` for ``RPG_INSTALL=worker_hooks`` (attribute -> piece)
PIECES = {
    "update_actor": update_actor, "compute_log_prob": compute_log_prob, "save_checkpoint": save_checkpoint,
    "load_checkpoint": load_checkpoint,
}
