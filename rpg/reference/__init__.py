"""The KL reference policy of RPG inside verl 0.9.1: `iterative`, `frozen`, `periodic` and `ema`; the adaptive β.

Modes (``actor_rollout_ref.actor.policy_loss.reference``, see `rpg.loss_config.RPGPolicyLossConfig`):

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

When verl is patched: only when a run asks for it, and only by `rpg.install`, the one installation point. ``import
verl`` runs the plugin entry point (`rpg.verl_plugin`), which registers names and installs exactly what the environment
variable ``RPG_INSTALL`` names: ``ref_log_prob`` (the adapter, for a reference mode other than ``iterative`` or a loss
that needs a reference model such as ``grpo_wk3``) and ``periodic_reference`` (the worker hooks). The launcher
(`rpg.launch`) derives that value from the composed config and puts it in the environment of every Ray process.
Building an `RPGPolicyLossConfig` changes nothing outside it. Each patch checks the verl version and the signature of
what it wraps (`rpg.compat`) and fails, naming both, before anything is patched (in the launcher: before Ray starts).
`require(settings)`, called by the RPG losses, fails clearly, naming the fix, when something the settings need is not
installed in the process that runs them (e.g. a run started with ``python -m verl.trainer.main_ppo`` without
``RPG_INSTALL``; docs/reference-modes.md#installation).
"""

from __future__ import annotations

from typing import Any

from rpg import install as _install
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
    "require",
    "token_kl_to_reference",
]


def checkpoint_extra_bytes(settings: Any, n_params: int) -> int:
    """Bytes the plugin adds to each checkpoint beyond verl's: the reference weights (fp32, all ranks' shards
    together) for ``periodic`` (once refreshed) and ``ema``; a few KB of JSON otherwise. For a free-disk estimate."""
    return 4 * int(n_params) if settings.reference in ("periodic", "ema") else 0


def require(settings: Any) -> None:
    """Raise RuntimeError naming what `settings` (an `RPGPolicyLossConfig`) needs that is not installed in this
    process, and the fix."""
    what = {_install.REF_LOG_PROB: "the ref_log_prob adapter around verl's ppo_loss",
            _install.PERIODIC_REFERENCE: "the periodic/EMA-reference and adaptive-β hooks on verl's ActorRolloutRefWorker"}  # fmt: skip
    needed = _install.needed(settings)
    absent = [name for name in needed if not _install.installed(name)]
    if absent:
        raise RuntimeError(
            f"loss_mode={settings.loss_mode!r} with reference={settings.reference!r} needs "
            f"{' and '.join(what[n] for n in absent)}, which is not installed in this process. rpg installs it at "
            f"`import verl` in every process whose environment has {_install.ENV} naming it (rpg/install.py): "
            f"`python -m rpg.launch` (every recipe) sets that for the whole run. A run started otherwise (e.g. python "
            f"-m verl.trainer.main_ppo) needs the override +ray_kwargs.ray_init.runtime_env.env_vars."
            f"{_install.ENV}={','.join(needed)} (or, on a local Ray cluster, export {_install.ENV}={','.join(needed)}); "
            f"in-process code calls rpg.install.install({list(needed)}) before the first loss call "
            f"(docs/reference-modes.md#installation)."
        )
