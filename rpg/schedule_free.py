"""Schedule-free AdamW for the RPG recipes, with one consistent parameter set per role (docs/schedule-free.md).

A schedule-free optimizer (`schedulefree.AdamWScheduleFree`, Defazio et al. 2024) keeps two parameter sets in the
same tensors: the *iterate* y, at which gradients are taken (``optimizer.train()``), and the *average* x, the point
that is meant to be evaluated and shipped (``optimizer.eval()``). The authors' code computes ``old_log_prob`` at x and
the update at y, and samples rollouts and validation with whichever set was loaded last (y), so the PPO/RPG ratio
``π_θ/π_old`` is not 1 on the first micro-batch and π_old is not the sampling policy (docs/differences.md#d16). Here:

=============================================  ======  =============================================================
what                                           set     where in verl 0.9.1
=============================================  ======  =============================================================
rollout sampling (weights pushed to servers)   y       ``ActorRolloutRefWorker.update_weights`` (reads the params)
``old_log_prob``                               y       ``compute_log_prob`` → ``TrainingWorker.infer_batch``
loss / gradient / optimizer step               y       ``update_actor`` → ``train_mini_batch`` → ``optimizer_step``
model + optimizer checkpoint shards            y       ``save_checkpoint`` (optimizer state has ``train_mode=True``)
validation rollouts                            x       trainer ``_validate``, framed by ``on_validate_begin/end``
HF export (``checkpoint.save_contents`` has    x       the ``huggingface/`` folder of a checkpoint
``hf_model``: the "final model")
=============================================  ======  =============================================================

So the parameters normally hold y (the optimizer lives in train mode), which makes the first three agree by
construction: π_old really is the sampling policy and the ratio is exactly 1 on the first micro-batch of a step.
Only two moments load x, each one switched back exactly afterwards:

* **Validation.** The rollout servers sample with whatever `update_weights` last pushed, so evaluating x means pushing
  x before validation and y back after it. verl's v1 trainer already frames `_validate` with the hooks
  ``on_validate_begin``/``on_validate_end``; `ScheduleFreeSyncTrainer` (verl's `PPOTrainerSync` plus those two hooks,
  registered in verl's trainer registry as ``trainer.v1.trainer_mode=schedule_free_sync``) switches the actor to x,
  re-syncs the servers, validates, switches back to y and re-syncs. Nothing is pushed when x == y (before the first
  optimizer step), e.g. for ``val_before_train``.
* **HF export.** `ScheduleFreeActorRolloutRefWorker.save_checkpoint` writes the training state (model shards,
  optimizer, extra) at y, then, only if ``hf_model`` is in ``save_contents``, writes the ``huggingface/`` export at x.
  A resumed run therefore restores y and the optimizer state (``z``, ``exp_avg_sq``, ``k``, ``weight_sum``,
  ``lr_max``, ``train_mode``) and continues bit-exactly. (Offline tools that merge the *sharded* model files, e.g.
  ``verl.model_merger``, produce y; use the ``huggingface/`` folder for the averaged model.)

Switching back to y restores a copy of y taken before the switch (`ScheduleFreeIterates`), instead of the
optimizer's inverse interpolation, whose floating-point round-off would make the continued run differ from a resumed
one. The copy lives on CPU (one parameter shard per rank) only while x is loaded.

Why these adapters: verl 0.9.1 already builds any optimizer class from Hydra (``optim.optimizer_impl`` +
``optim.optimizer``, ``verl.workers.config.optimizer.build_optimizer``), so the optimizer itself needs no code; it
has no notion of parameter sets, so the two moments above need hooks. The worker is an `ActorRolloutRefWorker`
subclass (one new remote method, `set_schedule_free_weights`, plus `init_model`/`save_checkpoint`/`load_checkpoint`
extended; `rpg.schedule_free_worker`); the trainer is a registered `PPOTrainerSync` subclass that uses verl's own
validation hooks and swaps the worker class in ``_init_resource_pool_mgr`` (`rpg.schedule_free_trainer`). No verl file
or function is patched.

Selecting it (the group ``optim=schedulefree``, rpg/config/optim/schedulefree.yaml, does this; the optimizer gets verl's ``lr``, ``weight_decay`` and
``betas``, warm-up stays verl's LambdaLR as in the authors' scripts, AdamWScheduleFree's own ``warmup_steps`` keeps
its default 0)::

    actor_rollout_ref.actor.optim.optimizer_impl=schedulefree
    actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFree
    trainer.v1.trainer_mode=schedule_free_sync

This module is the light part (no verl import): the parameter sets (`ScheduleFreeIterates`), the launcher's checks
(`check_config`, `check_resume`) and the piece of the trainer registry (`PIECES`). The verl subclasses live in
`rpg.schedule_free_worker` and `rpg.schedule_free_trainer`, apart from each other: a Ray worker imports the worker
module first (to unpickle its class), whose ``import verl`` installs this run's names, the trainer's registration
included; so the trainer module must not import the worker module at its top. Importing any of them changes nothing
in verl: the table of patch points (`rpg.patches`) registers the trainer in every process whose ``RPG_INSTALL`` names
``schedule_free``; the launcher sets that for a run with ``trainer.v1.trainer_mode=schedule_free_sync``. A run started with ``python -m verl.trainer.main_ppo`` adds
``+ray_kwargs.ray_init.runtime_env.env_vars.RPG_INSTALL=schedule_free`` (verl otherwise refuses the unknown trainer
mode). `check_config` validates that combination (launcher dry runs call it) and refuses to resume a checkpoint that holds
the other optimizer's state (`check_resume`). Supported: the v1 synchronous trainer with the FSDP/FSDP2 engine; async
trainer modes (rollouts from stale parameters) and the legacy trainer are refused.
"""

from __future__ import annotations

import glob
import importlib
import os
import pickle
import zipfile
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch

from rpg import modes

from rpg.shards import local_shard

__all__ = [
    "TRAINER_MODE",
    "ITERATE",
    "AVERAGE",
    "PIECES",
    "ScheduleFreeIterates",
    "is_schedule_free",
    "optimizer_class",
    "check_config",
    "check_resume",
]

TRAINER_MODE = modes.SCHEDULE_FREE_TRAINER.name  # "schedule_free_sync": its row of the trainer-mode table
ITERATE = "iterate"  # y: train mode — gradients, rollouts, old_log_prob, training checkpoints
AVERAGE = "average"  # x: eval mode — validation and the HF export
WEIGHT_SETS = (ITERATE, AVERAGE)
SUPPORTED_STRATEGIES = ("fsdp", "fsdp2")


def is_schedule_free(optimizer: Any) -> bool:
    """True for a schedule-free optimizer: it has ``train()``/``eval()`` and a ``train_mode`` flag per param group."""
    return (
        optimizer is not None
        and callable(getattr(optimizer, "train", None))
        and callable(getattr(optimizer, "eval", None))
        and all("train_mode" in group for group in getattr(optimizer, "param_groups", [{}]))
    )


class ScheduleFreeIterates:
    """Which parameter set a schedule-free optimizer's parameters currently hold: y (`ITERATE`) or x (`AVERAGE`).

    `use_average()` copies y to CPU and calls ``optimizer.eval()`` (x = y + (1 − 1/β1)(z − y), schedulefree's own
    formula); `use_iterate()` copies y back bit-exactly and sets the optimizer's ``train_mode`` flags. Both return
    whether the parameter values changed, so callers can skip re-syncing identical weights (before the first step
    there is no ``z`` yet and x == y).
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        if not is_schedule_free(optimizer):
            raise TypeError(
                f"{type(optimizer).__name__} is not a schedule-free optimizer (needs train()/eval() and a "
                f"'train_mode' flag in each param group, e.g. schedulefree.AdamWScheduleFree)"
            )
        self.optimizer = optimizer
        self._saved_iterate: Optional[list[torch.Tensor]] = None

    @property
    def params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    @property
    def current(self) -> str:
        modes = {bool(group["train_mode"]) for group in self.optimizer.param_groups}
        if len(modes) != 1:
            raise RuntimeError("schedule-free param groups disagree on train_mode; the parameters are inconsistent")
        return ITERATE if modes.pop() else AVERAGE

    def has_average(self) -> bool:
        """True once the optimizer has stepped (its state holds z), i.e. once x can differ from y."""
        return any("z" in self.optimizer.state.get(p, {}) for p in self.params)

    @torch.no_grad()
    def use_average(self) -> bool:
        """Load x (eval mode). Returns True if the parameter values changed."""
        if self.current == AVERAGE:
            return False
        if not self.has_average():
            self.optimizer.eval()  # flips the flags only: x == y before the first step
            return False
        self._saved_iterate = [local_shard(p).detach().to("cpu", copy=True) for p in self.params]
        self.optimizer.eval()
        return True

    @torch.no_grad()
    def use_iterate(self) -> bool:
        """Load y (train mode), restoring the copy taken by `use_average` exactly. Returns True if values changed."""
        if self.current == ITERATE:
            return False
        if self._saved_iterate is None:  # e.g. a checkpoint saved in eval mode by other code: schedulefree's inverse
            changed = self.has_average()
            self.optimizer.train()
            return changed
        for p, saved in zip(self.params, self._saved_iterate, strict=True):
            local_shard(p).copy_(saved)
        for group in self.optimizer.param_groups:
            group["train_mode"] = True
        self._saved_iterate = None
        return True

    def use(self, weights: str) -> bool:
        """`use_iterate` or `use_average` by name (`ITERATE` | `AVERAGE`)."""
        if weights not in WEIGHT_SETS:
            raise ValueError(f"schedule-free weights must be one of {list(WEIGHT_SETS)}, got {weights!r}")
        return self.use_iterate() if weights == ITERATE else self.use_average()

    @contextmanager
    def average(self) -> Iterator[bool]:
        """Hold x inside the block, then y again (even on error). Yields whether the values changed."""
        changed = self.use_average()
        try:
            yield changed
        finally:
            self.use_iterate()

    def after_load(self) -> None:
        """After a checkpoint load: drop any stale copy of y and make sure y is loaded.

        Raises RuntimeError, naming both optimizers and the fix, when the loaded state is not schedule-free's (a
        checkpoint of an AdamW run: its param groups carry no ``train_mode``)."""
        if not all("train_mode" in group for group in self.optimizer.param_groups):
            optimizer = f"{type(self.optimizer).__module__.split('.')[0]}.{type(self.optimizer).__name__}"
            raise RuntimeError(
                f"the checkpoint just loaded holds the optimizer state of a non-schedule-free optimizer (e.g. "
                f"torch.optim.AdamW), but this run's actor optimizer is {optimizer}. {_RESUME_FIX['adamw']}"
            )
        self._saved_iterate = None
        self.use_iterate()

#: the pieces of `rpg.patches` for ``RPG_INSTALL=schedule_free``: registry key -> the dotted name of the class
#: registered there (`rpg.schedule_free_trainer` imports this module and verl's trainer: named, not imported, here)
PIECES = {TRAINER_MODE: "rpg.schedule_free_trainer.ScheduleFreeSyncTrainer"}


def optimizer_class(optim_config: Any) -> type:
    """The class verl's `build_optimizer` will instantiate for an optimizer config (``optimizer_impl.optimizer``)."""
    impl = optim_config.get("optimizer_impl", "torch.optim")
    name = optim_config.get("optimizer", "AdamW")
    try:
        return getattr(importlib.import_module(impl), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"actor_rollout_ref.actor.optim: cannot import optimizer {impl}.{name} ({e}); for schedule-free AdamW use "
            f"optimizer_impl=schedulefree optimizer=AdamWScheduleFree (pip package 'schedulefree')"
        ) from e


_RESUME_FIX = {
    "adamw": "Resume with the optimizer the checkpoint was trained with (OPTIM=adamw, i.e. verl's default "
    "actor_rollout_ref.actor.optim), or start a new run from its weights (trainer.resume_mode=disable, or another "
    "trainer.default_local_dir).",
    "schedulefree": "Resume with the optimizer the checkpoint was trained with (OPTIM=schedulefree: "
    f"optim.optimizer_impl=schedulefree optim.optimizer=AdamWScheduleFree trainer.v1.trainer_mode={TRAINER_MODE}), "
    "or start a new run from its weights (trainer.resume_mode=disable, or another trainer.default_local_dir).",
}


class _Opaque:
    """Stands for every object of a pickle read by `_saved_optimizer_is_schedule_free` (tensors, DTensors, ...)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _StructureUnpickler(pickle.Unpickler):
    """Reads the containers of a pickle (dicts, lists, numbers, strings) without importing or loading anything."""

    def find_class(self, module: str, name: str) -> type:
        return _Opaque

    def persistent_load(self, pid: Any) -> None:  # torch's tensor storages
        return None


def _saved_optimizer_is_schedule_free(path: str) -> Optional[bool]:
    """Whether a ``torch.save``d optimizer state dict (verl's ``optim_world_size_*_rank_0.pt``) is a schedule-free
    optimizer's (its param groups carry ``train_mode``), read from the pickled structure only: no tensor is loaded, so
    this is instant for any model size. None if the file cannot be read this way."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
            with archive.open(name) as f:
                state = _StructureUnpickler(f).load()
        groups = state["param_groups"]
        return all("train_mode" in group for group in groups)
    except Exception:  # noqa: BLE001 -- an unreadable or unexpected file: leave the decision to the load itself
        return None


def _resumed_actor_checkpoint(config: Any) -> Optional[str]:
    """The actor checkpoint folder verl's trainer will resume from (`rpg.preflight.resume_ckpt`), or None."""
    from rpg.preflight.resume_ckpt import resume_target  # a floor above this module's: only the launcher's check

    folder = resume_target(config)
    return None if folder is None else os.path.join(folder, "actor")


def check_resume(config: Any, optimizer_is_sf: bool) -> None:
    """Refuse to resume a checkpoint whose optimizer state belongs to the other optimizer (schedule-free vs AdamW):
    verl would fail deep inside torch or schedulefree with a bare ``KeyError``. A missing or unreadable checkpoint is
    left to verl."""
    actor_dir = _resumed_actor_checkpoint(config)
    shards = sorted(glob.glob(os.path.join(actor_dir, "optim_world_size_*_rank_0.pt"))) if actor_dir else []
    saved_is_sf = _saved_optimizer_is_schedule_free(shards[0]) if shards else None
    if saved_is_sf is None or saved_is_sf == optimizer_is_sf:
        return
    optim = config.actor_rollout_ref.actor.optim
    configured = f"{optim.get('optimizer_impl', 'torch.optim')}.{optim.get('optimizer', 'AdamW')}"
    if saved_is_sf:
        saved, fix = "schedule-free (schedulefree.AdamWScheduleFree)", _RESUME_FIX["schedulefree"]
    else:
        saved, fix = "non-schedule-free (e.g. torch.optim.AdamW)", _RESUME_FIX["adamw"]
    raise ValueError(
        f"actor_rollout_ref.actor.optim selects {configured}, but the checkpoint this run resumes, {actor_dir}, holds "
        f"{saved} optimizer state, which {configured} cannot load. {fix}"
    )


def check_config(config: Any) -> bool:
    """Validate the schedule-free settings of a full ``ppo_trainer`` config. Returns True if schedule-free is on.

    Raises ValueError naming the offending key and the valid choices when the optimizer and the trainer disagree
    (a schedule-free optimizer under verl's plain trainers would validate at y; the schedule-free trainer with AdamW
    is almost certainly a mistake), when the run uses a setup the adapters do not cover, or when the checkpoint the
    run would resume holds the other optimizer's state (`check_resume`).
    """
    actor = config.actor_rollout_ref.actor
    optimizer_is_sf = all(callable(getattr(optimizer_class(actor.optim), m, None)) for m in ("train", "eval"))
    trainer = modes.trainer_mode(config)  # the trainer-mode table's row (rpg/modes.py)
    use_v1, mode, trainer_is_sf = trainer.use_v1, trainer.name, trainer.schedule_free
    if optimizer_is_sf and not trainer_is_sf:
        raise ValueError(
            f"actor_rollout_ref.actor.optim selects a schedule-free optimizer "
            f"({actor.optim.get('optimizer_impl')}.{actor.optim.get('optimizer')}) but "
            f"{'trainer.use_v1=False' if not use_v1 else f'trainer.v1.trainer_mode={mode}'}: set trainer.use_v1=True "
            f"and trainer.v1.trainer_mode={TRAINER_MODE} (rollouts, old_log_prob and updates at y, validation and "
            f"the HF export at the average x), e.g. with OPTIM=schedulefree"
            + (f"; schedule-free has no asynchronous trainer mode, so {mode} is not possible with it"
               if trainer.asynchronous else "")
        )
    if trainer_is_sf and not optimizer_is_sf:
        raise ValueError(
            f"trainer.v1.trainer_mode={TRAINER_MODE} needs a schedule-free actor optimizer, got "
            f"{actor.optim.get('optimizer_impl')}.{actor.optim.get('optimizer')}: set "
            f"actor_rollout_ref.actor.optim.optimizer_impl=schedulefree optimizer=AdamWScheduleFree, or use "
            f"trainer.v1.trainer_mode=sync for AdamW"
        )
    if optimizer_is_sf and actor.strategy not in SUPPORTED_STRATEGIES:
        raise ValueError(
            f"schedule-free support covers actor_rollout_ref.actor.strategy in {list(SUPPORTED_STRATEGIES)}, "
            f"got {actor.strategy!r}"
        )
    check_resume(config, optimizer_is_sf)
    return optimizer_is_sf
