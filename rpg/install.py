"""The one place where rpg-verl changes verl for a run: what the environment variable `RPG_INSTALL` names.

verl has no worker start-up hook, and the settings objects (`rpg.RPGPolicyLossConfig`) are plain values: building one
changes nothing outside it. What a run needs from verl beyond the registered names is installed here, and only here,
through the table of patch points `rpg.patches` (which verl object each name hooks, under which version guard):

====================  ==========================================================  ==================================
name in RPG_INSTALL   what is installed                                           selected by
====================  ==========================================================  ==================================
``ref_log_prob``      the ref_log_prob adapter in verl's ``ppo_loss``              a reference mode whose row has
                      (`rpg.reference.adapter`)                                   ``reference_model``, or a loss that
                                                                                  reads ``ref_log_prob`` (``grpo_wk3``)
``worker_hooks``      the worker hooks (periodic/EMA reference, adaptive β) on     a reference or KL-control mode whose
                      verl's ``ActorRolloutRefWorker`` (`rpg.reference.hooks`)     row has ``worker_state``
``schedule_free``     the trainer ``schedule_free_sync`` in verl's trainer         ``trainer.v1.trainer_mode=
                      registry (`rpg.schedule_free`)                              schedule_free_sync``
``mismatch_share``    the share of tokens with |Δ log p| > log 2 in verl's         a smoke run (``SMOKE=1``:
                      ``calculate_debug_metrics`` (`rpg.mismatch`)                 `for_smoke`)
``topk_kl``           the top-k KL's hook: support selection and per-token KL in  ``policy_loss.kl_estimator=topk``
                      verl's FSDP engine, its flags on ActorRolloutRefWorker, the
                      terms published in ppo_loss (`rpg.topk_hook`)
====================  ==========================================================  ==================================

``periodic_reference``, the former name of ``worker_hooks`` (which installs the EMA reference's and the adaptive β's
hooks too, not the periodic reference's alone), is accepted as an alias (`ALIASES`).

Contract (other modules and branches rely on it):

* `RPG_INSTALL` is a comma-separated list of the names above (order and repeats do not matter); unset or empty
  installs nothing, so a verl run that selects no RPG feature runs verl's own code. An unknown name is an error that
  lists the valid names.
* `install_from_environ()` is called by `rpg.verl_plugin`, the ``verl.plugins`` entry point that ``import verl`` runs
  in every process (driver, TaskRunner, workers). It installs exactly what `RPG_INSTALL` names: every guard
  (`rpg.compat`: verl version, signatures) runs before the first patch, so on an unsupported verl nothing is patched.
* `selected(config, settings)` is what a composed ``ppo_trainer`` config and its typed ``actor.policy_loss`` select.
  The launcher (`rpg.launch`) checks it before Ray starts (`check`) and, for a real launch, `export`s it: into its own
  environment and into the config's Ray runtime environment (``ray_kwargs.ray_init.runtime_env.env_vars.RPG_INSTALL``),
  which verl's `run_ppo` passes to ``ray.init``. Every Ray process then starts with it, on every node, also in a
  ``RAY_ADDRESS`` job (Ray merges the job's and the driver's runtime environments). The dry run's printed config is the
  one before `export`.
* `install(names)` installs names directly (tests, in-process tools), `uninstall(names)` removes them (verl's own
  objects back). `require(settings)`, called by the RPG losses, fails clearly when what their settings need is not
  installed in the process that runs them.
* Which names a reference or KL-control mode needs is its row's ``installs`` in the run-mode table
  (`rpg.modes`).

A run started without the launcher (``python -m verl.trainer.main_ppo``) that selects one of these modes must name it
itself: ``+ray_kwargs.ray_init.runtime_env.env_vars.RPG_INSTALL=ref_log_prob,worker_hooks`` (or
``export RPG_INSTALL=...`` for a local Ray cluster, whose processes inherit the shell's environment); without it the
RPG loss stops at its first call with a message naming this fix (docs/reference-modes.md#installation), and verl
refuses ``schedule_free_sync`` as an unknown trainer mode.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Optional

from rpg import modes, patches

ENV = "RPG_INSTALL"
REF_LOG_PROB, WORKER_HOOKS, SCHEDULE_FREE = patches.REF_LOG_PROB, patches.WORKER_HOOKS, patches.SCHEDULE_FREE
MISMATCH_SHARE, TOPK_KL = patches.MISMATCH_SHARE, patches.TOPK_KL
NAMES = patches.NAMES
ALIASES = {"periodic_reference": WORKER_HOOKS}  # a former name -> the name
WHAT = {i.name: i.what for i in patches.INSTALLS}

__all__ = ["ALIASES", "ENV", "NAMES", "check", "export", "for_smoke", "install", "install_from_environ", "installed",
           "names", "needed", "require", "selected", "uninstall"]


def names(value: str) -> tuple[str, ...]:
    """The names listed in an `RPG_INSTALL` value (aliases resolved), in the order of `NAMES`; ValueError for an
    unknown one."""
    given = {ALIASES.get(n.strip(), n.strip()) for n in value.split(",") if n.strip()}
    unknown = sorted(given - set(NAMES))
    if unknown:
        raise ValueError(f"{ENV}={value!r}: unknown {unknown}; valid names (comma-separated): {list(NAMES)} "
                         f"(aliases: {ALIASES})")
    return tuple(n for n in NAMES if n in given)


def check(selection: Iterable[str]) -> None:
    """The guards of what `install(selection)` would patch (RuntimeError naming verl's version or signature)."""
    patches.check(names(",".join(selection)))


def install(selection: Iterable[str]) -> None:
    """Install `selection` (idempotent); every guard runs first, so nothing is patched if one fails."""
    patches.install(names(",".join(selection)))


def uninstall(selection: Optional[Iterable[str]] = None) -> None:
    """Remove `selection` (None: everything installed); verl's own objects are back where nothing else is installed."""
    patches.uninstall(None if selection is None else names(",".join(selection)))


def installed(name: str) -> bool:
    """Whether `name` (or its alias) is installed in this process (imports nothing)."""
    return patches.installed(ALIASES.get(name, name))


def install_from_environ(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Install exactly what `RPG_INSTALL` names (nothing when unset); return the names. Run by `rpg.verl_plugin`."""
    selection = names(environ.get(ENV, ""))
    install(selection)
    return selection


def selected(config: Any, settings: Any) -> tuple[str, ...]:
    """The names a composed ``ppo_trainer`` config selects (`NAMES` order); installs nothing. `settings`: the typed
    ``actor.policy_loss`` built from `config` (the launcher's `ValidatedConfig.actor.policy_loss`)."""
    chosen = set()
    if hasattr(settings, "needs_ref_log_prob"):  # an RPGPolicyLossConfig (verl's own PolicyLossConfig selects none)
        chosen |= set(needed(settings))
    chosen |= set(modes.trainer_mode(config).installs)  # the trainer-mode table's row (rpg/modes.py)
    return tuple(n for n in NAMES if n in chosen)


def for_smoke(selection: Iterable[str]) -> tuple[str, ...]:
    """`selection` plus what a smoke run (`rpg.smoke`) adds for its report: the share of tokens whose trainer and
    rollout log-probs differ by more than log 2 (`rpg.mismatch`), after its guard (RuntimeError)."""
    check((MISMATCH_SHARE,))
    return names(",".join((*selection, MISMATCH_SHARE)))


def needed(settings: Any) -> tuple[str, ...]:
    """The names an `RPGPolicyLossConfig` needs: `ref_log_prob` when the loss reads ``ref_log_prob`` (a reference
    mode with a reference model, or a loss such as ``grpo_wk3``), and what the rows of its reference and KL-control
    modes install (`rpg.modes`: the worker hooks for periodic, ema, adaptive), and the top-k KL's hook for
    ``kl_estimator=topk``."""
    chosen = {REF_LOG_PROB} if settings.needs_ref_log_prob else set()
    chosen |= {name for row in modes.selected(settings) for name in row.installs}
    if getattr(settings, "topk", False):  # kl_estimator=topk: the engine hook (rpg.topk_hook)
        chosen.add(TOPK_KL)
    return tuple(n for n in NAMES if n in chosen)


def require(settings: Any) -> None:
    """Raise RuntimeError naming what `settings` (an `RPGPolicyLossConfig`) needs that is not installed in this
    process, and the fix. Called by the RPG losses at each call (cheap: a dict lookup per name)."""
    needed_names = needed(settings)
    absent = [name for name in needed_names if not installed(name)]
    if absent:
        raise RuntimeError(
            f"loss_mode={settings.loss_mode!r} with reference={settings.reference!r} needs "
            f"{' and '.join(WHAT[n] for n in absent)}, which is not installed in this process. rpg installs it at "
            f"`import verl` in every process whose environment has {ENV} naming it (rpg/install.py): "
            f"`python -m rpg.launch` (every recipe) sets that for the whole run. A run started otherwise (e.g. python "
            f"-m verl.trainer.main_ppo) needs the override +ray_kwargs.ray_init.runtime_env.env_vars."
            f"{ENV}={','.join(needed_names)} (or, on a local Ray cluster, export {ENV}={','.join(needed_names)}); "
            f"in-process code calls rpg.install.install({list(needed_names)}) before the first loss call "
            f"(docs/reference-modes.md#installation)."
        )


def export(config: Any, selection: Iterable[str], environ: dict = os.environ) -> str:
    """Put ``RPG_INSTALL=<selection>`` in `environ` and in the config's Ray runtime environment
    (``ray_kwargs.ray_init.runtime_env.env_vars``), so that every Ray process of the run installs it at ``import
    verl``; return the value. Called by the launcher after the checks, before verl's `run_ppo`."""
    from omegaconf import OmegaConf, open_dict

    value = ",".join(names(",".join(selection)))
    environ[ENV] = value
    with open_dict(config):
        OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{ENV}", value, force_add=True)
    return value
