"""Every verl object rpg-verl changes, in one table (`POINTS`), and the one mechanism that changes and restores them.

verl 0.9.1 has no extension point for what some RPG features need inside its worker (the reference log-probs and the
top-k terms inside ``ppo_loss``, the per-step state around ``update_actor``, the support selected in the log-prob
pass); where none exists, the feature hooks verl's object here, and only here. A row of `POINTS` is one patch
point: the verl module, the owner (a class of it, or the module itself), the attribute, verl's parameters (the
signature guard, `rpg.compat.require_signature`), the verl versions it was written for (`rpg.compat.SUPPORTED_VERL`)
and the ``RPG_INSTALL`` names (`INSTALLS`) whose pieces hook it. A name's pieces live in its module's ``PIECES``
(attribute -> piece); a piece is ``piece(call, *args, **kwargs)``: it runs around ``call``, the rest of the chain,
which ends in verl's own object.

* One wrapper per attribute. `install` puts at most one wrapper on a point, whatever the selection; each further name
  adds its piece to that wrapper, which runs the installed pieces in the row's order around verl's object. The
  wrapper carries `MARK` (its row and installed pieces) and ``__wrapped__`` = verl's object (``functools.wraps``, so
  verl's ``@register`` dispatch metadata is kept). That mark is the one idempotence mechanism.
* One micro-batch record. The ``ppo_loss`` rows run every call inside a fresh `rpg.reference.micro_batch.MicroBatch`
  (the row's ``frame``), which their pieces fill and the registered losses read.
* Guards first. `check` runs every guard of a selection (verl's version, each wrapped object's parameters) before
  `install` changes anything: on an unsupported verl nothing is patched.
* `uninstall` removes a name's pieces; a point left without pieces gets verl's object back (the identical object).

A registry row (``registry=True``) is a key of a verl registry (a dict): the schedule-free trainer, registered
through verl's own trainer registry and removed again by `uninstall`; its piece names the value (``module.attribute``,
imported at install).

Apart from the table, loaded only by CPU runs (``VERL_USE_EXTERNAL_MODULES``, rpg/preflight/recipe_argv.py) and never
undone in a process: the CPU platform's shims (`rpg.cpu.platform`: verl's ``initialize_global_process_group_ray`` and
``CPUOffloadPolicy`` for gloo and unpinned memory, each with the same guards) and the vLLM CPU patches
(`rpg.cpu.vllm_compat`: vLLM's objects, not verl's). They run at ``import verl`` before any RPG name is read, as a
platform rather than a feature: a CPU process needs them whatever it installs, and a GPU process never loads them.

A new patch point is one row here plus the piece in its name's module (LoRA's reference pass, for instance, is a
piece of ``worker_hooks`` on the existing ``compute_log_prob`` row).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, ContextManager, Iterable, Optional

from rpg import modes
from rpg.compat import SUPPORTED_VERL, require_signature, require_version
from rpg.reference import micro_batch

__all__ = ["INSTALLS", "MARK", "NAMES", "POINTS", "Install", "Point", "check", "install", "installed", "uninstall"]

MARK = "__rpg_patch__"

# ---- the names of RPG_INSTALL ------------------------------------------------------------------------------------
REF_LOG_PROB, WORKER_HOOKS = modes.REF_LOG_PROB, modes.WORKER_HOOKS  # the names a run mode may need (rpg.modes)
SCHEDULE_FREE, MISMATCH_SHARE, TOPK_KL = modes.SCHEDULE_FREE, "mismatch_share", "topk_kl"


@dataclass(frozen=True)
class Install:
    """One name of ``RPG_INSTALL``: the module whose ``PIECES`` hook its points, and what it is (for messages)."""

    name: str
    module: str
    what: str


INSTALLS = (
    Install(REF_LOG_PROB, "rpg.reference.adapter", "the ref_log_prob adapter around verl's ppo_loss"),
    Install(WORKER_HOOKS, "rpg.reference.hooks",
            "the periodic/EMA-reference and adaptive-β hooks on verl's ActorRolloutRefWorker"),
    Install(SCHEDULE_FREE, "rpg.schedule_free", "the trainer schedule_free_sync in verl's trainer registry"),
    Install(MISMATCH_SHARE, "rpg.mismatch",
            "the token share over |Δ log p| > log 2 in verl's calculate_debug_metrics"),
    Install(TOPK_KL, "rpg.topk_hook", "the top-k KL hook on verl's FSDP engine, ActorRolloutRefWorker and ppo_loss"),
)
NAMES = tuple(i.name for i in INSTALLS)
BY_NAME = {i.name: i for i in INSTALLS}


# ---- the table of patch points -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One verl object rpg-verl hooks (module docstring)."""

    module: str  # the verl module that holds it
    owner: str  # a class of `module` ("" = the module itself); for a registry row, the registry's name
    attribute: str  # the attribute; for a registry row, the key
    params: tuple[str, ...]  # verl's parameters, in order (the signature guard; () for a registry row)
    installs: tuple[str, ...]  # the RPG_INSTALL names with a piece here, in the order the pieces run (outermost first)
    version: str = SUPPORTED_VERL  # the verl versions it was written for
    frame: Optional[Callable[[], ContextManager]] = None  # a context every call of the wrapper runs in
    registry: bool = False  # a key of a verl registry (a dict), not an attribute

    @property
    def where(self) -> str:
        """``module.owner.attribute`` (a registry row: ``module.owner[key]``)."""
        owner = f"{self.module}.{self.owner}" if self.owner else self.module
        return f"{owner}[{self.attribute!r}]" if self.registry else f"{owner}.{self.attribute}"


LOSSES, WORKERS = "verl.workers.utils.losses", "verl.workers.engine_workers"
ENGINE, TRAINER = "verl.workers.engine.fsdp.transformer_impl", "verl.trainer.ppo.v1.trainer_base"
WORKER = "ActorRolloutRefWorker"
PPO_LOSS = ("config", "model_output", "data", "dp_group")
WORKER_DATA = ("self", "data")
SAVE = ("self", "local_path", "hdfs_path", "global_step", "max_ckpt_to_keep")
LOAD = ("self", "local_path", "hdfs_path", "del_local_after_load")
MODEL_OUTPUTS = ("self", "output", "output_args", "micro_batch", "logits_processor_func")
SCHEDULE_FREE_TRAINER = modes.SCHEDULE_FREE_TRAINER.name  # the trainer-mode row rpg.schedule_free registers

POINTS = (
    # verl's actor loss, where a registered policy loss runs: the reference log-probs and the top-k terms
    Point(LOSSES, "", "ppo_loss", PPO_LOSS, (REF_LOG_PROB, TOPK_KL), frame=micro_batch.opened),
    # ... and the copy engine_workers binds with `from verl.workers.utils.losses import ppo_loss` (the one it calls)
    Point(WORKERS, "", "ppo_loss", PPO_LOSS, (REF_LOG_PROB, TOPK_KL), frame=micro_batch.opened),
    # one training step: the per-mode worker state (β, reference refresh) and the top-k update's request
    Point(WORKERS, WORKER, "update_actor", WORKER_DATA, (WORKER_HOOKS, TOPK_KL)),
    # the log-prob passes: the top-k support is selected in the pass of the KL's reference; in a LoRA run verl's
    # reference pass is compute_log_prob with no_lora_adapter=True, where the periodic reference swaps its adapter
    # snapshot in (the top-k piece runs first: it reads the flag the worker hooks' piece takes out)
    Point(WORKERS, WORKER, "compute_log_prob", WORKER_DATA, (TOPK_KL, WORKER_HOOKS)),
    Point(WORKERS, WORKER, "compute_ref_log_prob", WORKER_DATA, (TOPK_KL,)),
    # the worker state's own files next to verl's actor checkpoint
    Point(WORKERS, WORKER, "save_checkpoint", SAVE, (WORKER_HOOKS,)),
    Point(WORKERS, WORKER, "load_checkpoint", LOAD, (WORKER_HOOKS,)),
    # the model outputs of a micro-batch: the support, and the top-k KL with its gradient
    Point(ENGINE, "FSDPEngineWithLMHead", "prepare_model_outputs", MODEL_OUTPUTS, (TOPK_KL,)),
    # the trainer's rollout/trainer mismatch metrics (a smoke run's report)
    Point(TRAINER, "", "calculate_debug_metrics", ("data",), (MISMATCH_SHARE,)),
    # verl's trainer registry: the schedule-free trainer (verl's own extension point; undone by uninstall)
    Point(TRAINER, "TRAINER_REGISTRY", SCHEDULE_FREE_TRAINER, (), (SCHEDULE_FREE,), registry=True),
)


# ---- the one wrapper of a point ------------------------------------------------------------------------------------
class Patch:
    """What the wrapper of a point carries as `MARK`: its row, verl's object and the installed pieces by name."""

    def __init__(self, point: Point, original: Any):
        self.point, self.original = point, original
        self.pieces: dict[str, Callable] = {}
        self.call: Callable = original

    def set(self, name: str, piece: Optional[Callable]) -> None:
        """Install `piece` for `name` (None: remove it), then rebuild the chain in the row's order."""
        if piece is None:
            self.pieces.pop(name, None)
        else:
            self.pieces[name] = piece
        call = self.original
        for installed_name in reversed(self.point.installs):
            if installed_name in self.pieces:
                call = functools.partial(self.pieces[installed_name], call)
        self.call = call


def _wrap(point: Point, original: Callable) -> Callable:
    """The one wrapper of `point` around verl's `original`: runs `Patch.call` (the installed pieces, then verl's
    object) inside the row's frame."""
    patch = Patch(point, original)
    frame = point.frame or contextlib.nullcontext

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        with frame():
            return patch.call(*args, **kwargs)

    setattr(wrapper, MARK, patch)
    return wrapper


def patch_of(obj: Any) -> Optional[Patch]:
    """The `Patch` an rpg wrapper carries, or None for any other object."""
    patch = getattr(obj, MARK, None)
    return patch if isinstance(patch, Patch) else None


# ---- reading the points ------------------------------------------------------------------------------------------
def _owner(point: Point, module: ModuleType) -> Any:
    if not point.owner:
        return module
    try:
        return getattr(module, point.owner)
    except AttributeError:
        raise RuntimeError(f"rpg/patches.py hooks {point.where}, but the installed verl has no {point.module}."
                           f"{point.owner}; rpg-verl supports verl{point.version}") from None


def _current(point: Point, owner: Any) -> Any:
    """The object at `point` now (a class's own attribute, not an inherited one); None for an absent registry key."""
    if point.registry:
        return owner.get(point.attribute)
    found = vars(owner).get(point.attribute) if isinstance(owner, type) else getattr(owner, point.attribute, None)
    if found is None:
        raise RuntimeError(f"rpg/patches.py hooks {point.where}, which the installed verl does not have; rpg-verl "
                           f"supports verl{point.version}")
    return found


def points(names: Iterable[str]) -> tuple[Point, ...]:
    """The rows hooked by any of `names`, in table order."""
    chosen = set(names)
    return tuple(p for p in POINTS if chosen & set(p.installs))


def pieces(name: str) -> dict[str, Callable]:
    """The pieces of `name` (attribute -> piece), from its module's ``PIECES`` (imports that module)."""
    return importlib.import_module(BY_NAME[name].module).PIECES


def _what(point: Point, names: Iterable[str]) -> str:
    mine = [n for n in point.installs if n in set(names)]
    return f"{' and '.join(BY_NAME[n].what for n in mine)} (RPG_INSTALL={','.join(mine)}; rpg/patches.py)"


def _names(names: Iterable[str]) -> tuple[str, ...]:
    given = set(names)
    unknown = sorted(given - set(NAMES))
    if unknown:
        raise ValueError(f"unknown RPG_INSTALL names {unknown}; valid names: {list(NAMES)}")
    return tuple(n for n in NAMES if n in given)


# ---- check, install, uninstall -------------------------------------------------------------------------------------
def check(names: Iterable[str]) -> None:
    """Raise RuntimeError if installing `names` would hook a verl object of an unsupported version or signature
    (imports the verl modules of their rows and the names' modules)."""
    names = _names(names)
    for name in names:
        expected = {p.attribute for p in points((name,))}
        if set(pieces(name)) != expected:
            raise RuntimeError(f"{BY_NAME[name].module}.PIECES hooks {sorted(pieces(name))}, but the table of patch "
                               f"points (rpg/patches.py) gives {name} {sorted(expected)}")
    for point in points(names):
        current = _current(point, _owner(point, importlib.import_module(point.module)))
        what = _what(point, names)
        require_version("verl", point.version, what)
        if point.registry:
            if current is not None and vars(current).get(MARK) is None:
                raise RuntimeError(f"{what}: {point.where} already holds {current!r}, which is not rpg's")
        elif patch_of(current) is None:
            require_signature(current, point.params, what)
            if inspect.iscoroutinefunction(current):  # the wrapper and its pieces are synchronous
                raise RuntimeError(f"{what}: {point.where} is a coroutine function in the installed verl; rpg-verl "
                                   f"supports verl{point.version}, where it is synchronous")


def install(names: Iterable[str]) -> None:
    """Hook the points of `names` (idempotent), after `check`: nothing is patched if a guard fails."""
    names = _names(names)
    check(names)
    for point in points(names):
        owner = _owner(point, sys.modules[point.module])
        for name in (n for n in point.installs if n in names):
            piece = pieces(name)[point.attribute]
            if point.registry:
                _register(point, owner, name, piece)
                continue
            current = _current(point, owner)
            patch = patch_of(current)
            if patch is None:
                setattr(owner, point.attribute, _wrap(point, current))
                patch = patch_of(_current(point, owner))
            patch.set(name, piece)


def _register(point: Point, owner: dict, name: str, piece: str) -> None:
    """A registry row: put the object the piece names (``module.attribute``, imported now) under the key, marked with
    `name` (idempotent)."""
    module, _, attribute = piece.rpartition(".")
    value = getattr(importlib.import_module(module), attribute)
    if owner.get(point.attribute) is not value:
        owner[point.attribute] = value
    setattr(value, MARK, name)


def uninstall(names: Optional[Iterable[str]] = None) -> None:
    """Remove the pieces of `names` (None: every name); a point left without pieces gets verl's own object back.
    Imports nothing: a verl module that was never imported holds no patch."""
    names = NAMES if names is None else _names(names)
    for point in points(names):
        module = sys.modules.get(point.module)
        if module is None:
            continue
        owner = _owner(point, module)
        current = _current(point, owner)
        if point.registry:
            if current is not None and vars(current).get(MARK) in names:
                del owner[point.attribute]
                delattr(current, MARK)
            continue
        patch = patch_of(current)
        if patch is None:
            continue
        for name in names:
            patch.set(name, None)
        if not patch.pieces:
            setattr(owner, point.attribute, patch.original)


def installed(name: str) -> bool:
    """Whether every point of `name` runs its piece in this process (imports nothing)."""
    for point in points((name,)):
        module = sys.modules.get(point.module)
        if module is None or BY_NAME[name].module not in sys.modules:
            return False
        owner = getattr(module, point.owner) if point.owner else module
        current = owner.get(point.attribute) if point.registry else getattr(owner, point.attribute, None)
        if point.registry:
            if current is None or vars(current).get(MARK) != name:
                return False
        elif (patch := patch_of(current)) is None or name not in patch.pieces:
            return False
    return True
