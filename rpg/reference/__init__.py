"""The KL reference policy of RPG inside verl 0.9.1: `iterative`, `frozen`, `periodic` and `ema`; the adaptive β.

Modes (``actor_rollout_ref.actor.policy_loss.reference``, see `rpg.config.RPGPolicyLossConfig`):

* ``iterative`` (default; paper §5 and every RPG script): π_ref = π_old, the policy that sampled the batch. The losses
  use ``old_log_prob``; no reference model is built (``actor.use_kl_loss=False``) and nothing in this package is
  installed.
* ``frozen``: π_ref = the initial model, computed by verl's own reference worker (``actor.use_kl_loss=True`` with
  ``actor.kl_loss_coef=0`` so that verl builds it and ships ``ref_log_prob`` but adds no KL term of its own). This is
  the Fig. 9 "no iterative reference" ablation. The losses use the ρ-weighted surrogates (ρ = π_ref/π_old).
* ``ema``: π_ref ← τ·π_ref + (1 − τ)·π_θ every ``ref_ema_period`` optimizer steps (EMA-PG, arXiv 2602.04417), an
  fp32 blend of each rank's own reference shards (`rpg.reference.weights`), through the periodic machinery.
* ``kl_control='adaptive'`` (any mode): β follows Ziegler et al.'s proportional controller
  (`rpg.reference.adaptive_kl`).
* ``periodic``: the paper's scheme "set the reference to the current policy every K optimizer steps, or when a moving
  average of the token-level KL exceeds κ" (paper §5, "Iterative reference updates"; the authors' code does not
  implement it). Same verl setup as ``frozen``; in addition the reference weights are overwritten with the actor's.

Cost: ``frozen``/``periodic`` keep a second copy of the weights (the reference engine; verl shards/offloads it like the
actor's parameters, without optimizer state) and run one extra forward pass per training step (verl's
``compute_ref_log_prob``). A ``periodic`` refresh copies the actor's parameter shards into the reference's (a memory
copy of each rank's own shards when both engines use the same FSDP2 layout; no forward pass).

One module per job:

* `rpg.reference.adapter` — the ``ref_log_prob`` adapter around verl's ``ppo_loss`` (`current_ref_log_prob`) and
  the token KL meter;
* `rpg.reference.schedule` — `RefreshSchedule`, when the periodic reference is refreshed (pure);
* `rpg.reference.periodic` — the periodic reference in verl's worker: the weight copy, the hooks on
  ``ActorRolloutRefWorker`` and the checkpoint of the reference state.

When verl is patched: only when a run asks for it. ``import verl`` (the plugin entry point) registers names and
patches nothing. This package registers `install` with `rpg.config.on_build`, so `install(settings)` runs at the end of
every `RPGPolicyLossConfig.__post_init__` in a process that imported it — every verl process does, through the plugin
entry point (`rpg.verl_plugin` imports `rpg.losses`, which imports this package). verl builds the actor config in the
launcher's dry run and, in every actor worker, in ``ActorRolloutRefWorker.init_model``
(``omega_conf_to_dataclass(config.actor)``), which runs before it binds ``ppo_loss`` into the worker's loss function
and before any training step. `install` installs the adapter when the settings need ``ref_log_prob`` (a reference mode
other than ``iterative``, or a loss that needs a reference model such as ``grpo_wk3``) and, for ``periodic``, the
worker hooks. Each patch checks the verl version and the signature of what it wraps (`rpg.compat`) and fails at
start-up, naming both, when they differ (in the launcher: before Ray starts). `require(settings)`, called by the RPG
losses, fails clearly when something the settings need is not installed in the process that runs them (e.g. a loss
config that reached a process without being built there).
"""

from __future__ import annotations

from typing import Any

from rpg.config import on_build
from rpg.reference import adapter, periodic
from rpg.reference.adapter import current_ref_log_prob, token_kl_to_reference
from rpg.reference.adaptive_kl import AdaptiveKLCoef, current_kl_coef
from rpg.reference.periodic import PeriodicReference
from rpg.reference.schedule import ReferenceState, RefreshSchedule
from rpg.reference.weights import blend_policy_weights, copy_policy_weights

__all__ = [
    "AdaptiveKLCoef",
    "PeriodicReference",
    "ReferenceState",
    "RefreshSchedule",
    "blend_policy_weights",
    "checkpoint_extra_bytes",
    "copy_policy_weights",
    "current_kl_coef",
    "current_ref_log_prob",
    "install",
    "require",
    "token_kl_to_reference",
]


def _needed(settings: Any) -> list[tuple[str, Any]]:
    """(what, module) pairs `settings` (an `RPGPolicyLossConfig`) needs installed."""
    needed = []
    if settings.needs_ref_log_prob:
        needed.append(("the ref_log_prob adapter around verl's ppo_loss", adapter))
    if settings.reference in ("periodic", "ema") or getattr(settings, "kl_control", "fixed") == "adaptive":
        needed.append(("the periodic/EMA-reference and adaptive-β hooks on verl's ActorRolloutRefWorker", periodic))
    return needed


def checkpoint_extra_bytes(settings: Any, n_params: int) -> int:
    """Bytes the plugin adds to each checkpoint beyond verl's: the reference weights (fp32, all ranks' shards
    together) for ``periodic`` (once refreshed) and ``ema``; a few KB of JSON otherwise. For a free-disk estimate."""
    return 4 * int(n_params) if settings.reference in ("periodic", "ema") else 0


@on_build
def install(settings: Any) -> None:
    """Install what `settings` needs (nothing for the iterative reference with a loss that needs no reference).

    Every guard runs before the first patch: on an unsupported verl nothing is patched."""
    needed = [module for _, module in _needed(settings)]
    for module in needed:
        module.check()
    for module in needed:
        module.install()


def require(settings: Any) -> None:
    """Raise RuntimeError naming what `settings` needs and is not installed in this process."""
    absent = [what for what, module in _needed(settings) if not module.installed()]
    if absent:
        raise RuntimeError(
            f"loss_mode={settings.loss_mode!r} with reference={settings.reference!r} needs "
            f"{' and '.join(absent)}, which is not installed in this process. It is installed when "
            f"rpg.RPGPolicyLossConfig is built in a process that imported rpg.reference (verl's "
            f"ActorRolloutRefWorker.init_model builds it from "
            f"actor_rollout_ref.actor.policy_loss with _target_=rpg.RPGPolicyLossConfig); if this process builds the "
            f"loss config another way, call rpg.reference.install(settings) first."
        )
