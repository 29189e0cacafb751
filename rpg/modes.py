"""The table of run modes: one row per KL reference (``policy_loss.reference``) and per KL control
(``policy_loss.kl_control``), and the checks of their options. docs/reference-modes.md explains each row. Beside it,
the same kind of table for the trainer verl runs (`TRAINER_MODES`, ``trainer.v1.trainer_mode``; docs/async.md#knobs),
for the KL estimator (`ESTIMATORS`, ``policy_loss.kl_estimator``; docs/losses.md#topk-kl) and for the top-k KL's tail
(`TOPK_TAILS`, ``policy_loss.kl_topk_tail``).

Every other module reads the rows; none compares a mode, trainer, estimator or tail name
(tests/reference/test_modes_on_cpu.py checks the source of rpg/ for that): the config's choices and option checks
(`rpg.loss_config`), what a run installs (`rpg.install`), the launcher's rules (`rpg.preflight`), the free-disk
estimate (`checkpoint_bytes`), the dry-run summary (`describe`), the recipe knobs of a mode
(`rpg.preflight.recipe_argv.MODE_KNOBS`), what a smoke run forces (`rpg.smoke`) and the per-mode state the worker
hooks build (`rpg.reference.hooks.STATES`). A new mode is one row here plus, if it acts in verl's worker, its state class
registered in `rpg.reference.hooks`.

Pure Python: imports nothing (the launcher's early checks read it before verl is imported).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

# the names of `rpg.install` (RPG_INSTALL) a mode may need: defined here so that this table imports nothing
REF_LOG_PROB, WORKER_HOOKS = "ref_log_prob", "worker_hooks"
SCHEDULE_FREE = "schedule_free"
POLICY_LOSS = "actor_rollout_ref.actor.policy_loss."
#: what every mode with a reference model needs from verl: its reference worker, and no KL of verl's own
REFERENCE_MODEL_SETTINGS = ("actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0")
VERIFY_ENV = "RPG_SMOKE_VERIFY_REFRESH"  # SMOKE=1: every rank checks each write of the reference weights


@dataclass(frozen=True)
class Option:
    """A policy-loss option that acts only with its mode (or estimator), and its valid values: the checks' error
    messages state the range as `valid` says it (`Option.invalid`)."""

    name: str
    valid: str  # the range, as the error messages and docs state it
    meaning: str = ""  # what the value is, in the error messages

    def invalid(self, owner: str, value: Any, label: str = "") -> str:
        """The error message of `value` out of `valid`: ``<owner>: <name> (<meaning>) must be <valid>, got <value>``
        (`label` in place of name and meaning when the caller names the setting its own way)."""
        what = label or (f"{self.name} ({self.meaning})" if self.meaning else self.name)
        return f"{owner}: {what} must be {self.valid}, got {value!r}"


@dataclass(frozen=True)
class Mode:
    """One row: a value of ``policy_loss.<setting>`` and everything the code needs to know about it."""

    name: str
    setting: str  # "reference" or "kl_control"
    reference_model: bool  # needs verl's reference model (ref_log_prob): REFERENCE_MODEL_SETTINGS
    writes_reference: bool  # overwrites the reference engine's weights in the actor's process
    worker_state: bool  # has per-step state in verl's actor worker (`rpg.reference.hooks.STATES`)
    options: tuple[Option, ...] = ()
    required: tuple[str, ...] = ()  # overrides a run of this mode must add (no default works), with a typical value
    knobs: tuple[str, ...] = ()  # the recipe environment knobs of its options (recipe_argv.MODE_KNOBS)
    metrics: tuple[str, ...] = ()  # actor/rpg/<name>, logged every training step
    smoke: tuple[str, ...] = ()  # overrides a smoke run adds so that the mode acts at each of its steps
    fp32_reference: bool = False  # the reference engine must store fp32 (an in-place blend)
    checkpoint_label: str = ""  # the reference weights it saves next to the actor's checkpoint ("" = none)
    describe: str = "{name}"  # the dry-run summary's text; {option} fields take the run's values
    moves_beta: bool = False  # β follows a controller (the losses read the step's β)
    needs_a_trigger: bool = False  # its options must enable at least one trigger (K > 0 and/or κ > 0)

    @property
    def key(self) -> str:
        return POLICY_LOSS + self.setting

    @property
    def installs(self) -> tuple[str, ...]:
        """The `RPG_INSTALL` names this mode needs."""
        return (REF_LOG_PROB,) * self.reference_model + (WORKER_HOOKS,) * self.worker_state

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    @property
    def verl_settings(self) -> tuple[str, ...]:
        return REFERENCE_MODEL_SETTINGS if self.reference_model else ()

    def whole_fix(self) -> str:
        """Every override that selects this mode and gives it what it needs, in one line."""
        return " ".join((f"{self.key}={self.name}", *self.verl_settings, *self.required))


MIN_HORIZON = 0.2  # the controller's clipped error is in [−0.2, 0.2]: H > 0.2 keeps every multiplier 1 + e/H > 0

_PERIODIC_OPTIONS = (
    Option("ref_refresh_steps", "an integer ≥ 0", "K, optimizer steps; 0 = no step criterion"),
    Option("ref_refresh_kl", "a finite number ≥ 0", "κ; 0 = no KL criterion"),
    Option("ref_kl_ema", "in [0, 1)", "decay of the KL moving average, per training step"),
)
_EMA_OPTIONS = (
    Option("ref_ema_decay", "in [0, 1)", "τ of the EMA reference, π_ref ← τ·π_ref + (1 − τ)·π_θ"),
    Option("ref_ema_period", "an integer ≥ 1", "optimizer steps between EMA updates, the unit of ref_refresh_steps"),
)
_ADAPTIVE_OPTIONS = (
    Option("kl_target", "a finite number > 0 with kl_control='adaptive'",
           "target of the adaptive β, per-token KL of the chosen divergence"),
    Option("kl_horizon", f"a finite number > {MIN_HORIZON}",
           "H, in training steps; β ← β·(1 + clip(KL/target − 1, ±0.2)/H)"),
)

ROWS: tuple[Mode, ...] = (
    Mode("iterative", "reference", reference_model=False, writes_reference=False, worker_state=False,
         describe="{name} (π_ref = π_old, no reference model)"),
    Mode("frozen", "reference", reference_model=True, writes_reference=False, worker_state=False),
    Mode("periodic", "reference", reference_model=True, writes_reference=True, worker_state=True,
         options=_PERIODIC_OPTIONS, required=(f"{POLICY_LOSS}ref_refresh_steps=<K, e.g. 64>",),
         knobs=("REF_REFRESH_STEPS", "REF_REFRESH_KL"),
         metrics=("ref_refreshed", "ref_refresh_count", "ref_steps_since_refresh", "ref_refresh_time_s", "ref_kl",
                  "ref_kl_ema"),
         smoke=(f"+{POLICY_LOSS}ref_refresh_steps=1",), checkpoint_label="periodic reference weights",
         needs_a_trigger=True,
         describe="{name} (K {ref_refresh_steps}, κ {ref_refresh_kl})"),
    Mode("ema", "reference", reference_model=True, writes_reference=True, worker_state=True, options=_EMA_OPTIONS,
         knobs=("REF_EMA_DECAY", "REF_EMA_PERIOD"),
         metrics=("ref_ema_updated", "ref_ema_update_count", "ref_ema_steps_since_update", "ref_ema_time_s",
                  "ref_ema_decay", "ref_kl"),
         smoke=(f"+{POLICY_LOSS}ref_ema_period=1",), fp32_reference=True, checkpoint_label="EMA reference weights",
         describe="{name} (τ {ref_ema_decay}, every {ref_ema_period} optimizer steps)"),
    Mode("fixed", "kl_control", reference_model=False, writes_reference=False, worker_state=False,
         describe="β = {kl_coef:g} (policy_loss.kl_coef)"),
    Mode("adaptive", "kl_control", reference_model=False, writes_reference=False, worker_state=True,
         options=_ADAPTIVE_OPTIONS, required=(f"{POLICY_LOSS}kl_target=<KL per token, e.g. 1e-3>",),
         knobs=("KL_TARGET", "KL_HORIZON"), metrics=("kl_coef", "kl_coef_next", "kl_ctrl_kl"), moves_beta=True,
         describe="adaptive: β starts at {kl_coef:g}, target KL {kl_target}, horizon {kl_horizon} steps "
                  "(policy_loss.kl_control)"),
)

REFERENCES: dict[str, Mode] = {m.name: m for m in ROWS if m.setting == "reference"}
KL_CONTROLS: dict[str, Mode] = {m.name: m for m in ROWS if m.setting == "kl_control"}
#: the defaults of the tables' settings (trainer_mode: verl's ppo_trainer.yaml, trainer.v1.trainer_mode)
DEFAULTS = {"reference": "iterative", "kl_control": "fixed", "kl_estimator": "sampled", "trainer_mode": "sync"}
#: the options' defaults (one place: `rpg.loss_config.RPGPolicyLossConfig` declares its fields with these)
OPTION_DEFAULTS = {
    "ref_refresh_steps": 0, "ref_refresh_kl": 0.0, "ref_kl_ema": 0.9, "ref_ema_decay": 0.99, "ref_ema_period": 1,
    "kl_target": 0.0, "kl_horizon": 10.0,
}
OPTIONS: dict[str, Option] = {o.name: o for m in ROWS for o in m.options}


# ---------------------------------------------------------------------------------------------------------------------
# The KL estimator (policy_loss.kl_estimator) and the top-k KL's tail (policy_loss.kl_topk_tail); docs/losses.md#topk-kl
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TopKTail:
    """One value of ``policy_loss.kl_topk_tail``: the top-k KL outside its support S (`rpg.topk_kl`)."""

    name: str
    in_logits: bool  # a function of the current logits, computed with the analytic part by the engine hook (bucket)

    @property
    def in_loss(self) -> bool:
        """The tail is a function of the sampled token's log-probs, added by the loss (`rpg.topk_kl.sampled_tail`)."""
        return not self.in_logits


TOPK_TAILS: dict[str, TopKTail] = {t.name: t for t in (
    # 1[y∉S]·w·log(p_y/q_y) (forward ρ·log(q_y/p_y)): unbiased in value and gradient
    TopKTail("sampled", in_logits=False),
    # the tail as one token T: p_T·log(p_T/q_T) (forward q_T·log(q_T/p_T)), a lower bound
    TopKTail("bucket", in_logits=True),
)}


@dataclass(frozen=True)
class Estimator:
    """One value of ``policy_loss.kl_estimator``: how the RPG losses estimate the per-token KL they regularise, the
    one an adaptive β tracks (docs/losses.md#adaptive-beta): sampled, `actor/rpg/kl`; topk, `actor/rpg/topk_kl`."""

    name: str
    support: bool  # computed at a support of kl_topk tokens per position from the current logits (rpg.topk_hook)
    options: tuple[Option, ...] = ()

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)


_TOPK_OPTIONS = (
    Option("kl_topk", "an integer ≥ 1 (and at most the vocabulary)", "k, the support's token ids per position"),
    Option("kl_topk_tail", f"one of {list(TOPK_TAILS)}", "the KL outside the support"),
)
ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("sampled", support=False),  # the paper's: from the sampled token, `Divergence.estimate`
    Estimator("topk", support=True, options=_TOPK_OPTIONS),  # the engine hook `rpg.topk_hook` (RPG_INSTALL=topk_kl)
)}
OPTION_DEFAULTS |= {"kl_topk": 64, "kl_topk_tail": "sampled"}
OPTIONS |= {o.name: o for e in ESTIMATORS.values() for o in e.options}


def estimator(name: Any) -> Estimator:
    """The row of ``policy_loss.kl_estimator=name`` (ValueError listing the choices)."""
    return _row(ESTIMATORS, "RPGPolicyLossConfig.kl_estimator", name)


def topk_tail(tail: Any) -> TopKTail:
    """The row of ``policy_loss.kl_topk_tail=tail`` (a row is returned as it is; ValueError listing the choices)."""
    return tail if isinstance(tail, TopKTail) else _row(TOPK_TAILS, "RPGPolicyLossConfig.kl_topk_tail", tail)


def estimator_option_owner(option: str) -> Estimator | None:
    """The estimator row whose option `option` is, or None."""
    return next((e for e in ESTIMATORS.values() if option in e.option_names), None)


# ---------------------------------------------------------------------------------------------------------------------
# The trainer (trainer.use_v1, trainer.v1.trainer_mode); docs/async.md#knobs
# ---------------------------------------------------------------------------------------------------------------------
TRAINER_MODE_KEY = "trainer.v1.trainer_mode"


@dataclass(frozen=True)
class TrainerMode:
    """One row: a trainer a run can select, verl's (registered by verl in its trainer registry) or rpg's."""

    name: str
    use_v1: bool = True  # verl's v1 trainer (PPOTrainer); False: the legacy RayPPOTrainer (trainer.use_v1=False)
    asynchronous: bool = False  # rollouts run ahead of the update (stale samples, verl's ReplayBufferAsync)
    saves_transfer_queue: bool = False  # its checkpoints hold transfer_queue/ (verl: any v1 trainer_mode but sync)
    detached_actor: bool = False  # the actor is verl's DetachActorWorker, not the worker rpg's hooks wrap
    schedule_free: bool = False  # needs a schedule-free optimizer (rpg.schedule_free: updates at y, validation at x)
    installs: tuple[str, ...] = ()  # the RPG_INSTALL names that register it in verl's trainer registry (rpg.install)
    knob: bool = False  # a value of the recipe knob TRAINER_MODE (rpg.preflight.recipe_argv.CHOICES)

    @property
    def overrides(self) -> tuple[str, ...]:
        """The Hydra overrides that select this trainer over verl's default (sync: none)."""
        if not self.use_v1:
            return ("trainer.use_v1=False",)
        return () if self.name == DEFAULTS["trainer_mode"] else (f"{TRAINER_MODE_KEY}={self.name}",)


TRAINER_MODES: dict[str, TrainerMode] = {t.name: t for t in (
    TrainerMode("sync", knob=True),  # the paper's
    TrainerMode("colocate_async", asynchronous=True, saves_transfer_queue=True, knob=True),
    TrainerMode("separate_async", asynchronous=True, saves_transfer_queue=True, detached_actor=True, knob=True),
    # rpg.schedule_free's: verl's sync trainer registered under its own name; it reports "sync" to verl's base class
    TrainerMode("schedule_free_sync", schedule_free=True, installs=(SCHEDULE_FREE,)),
)}
LEGACY_TRAINER = TrainerMode("legacy", use_v1=False)  # verl's RayPPOTrainer: no trainer_mode, no TransferQueue
SCHEDULE_FREE_TRAINER = next(t for t in TRAINER_MODES.values() if t.schedule_free)


def trainer_mode(config: Any) -> TrainerMode:
    """The row of the trainer a composed ``ppo_trainer`` config (DictConfig or mapping) runs: `LEGACY_TRAINER` with
    ``trainer.use_v1=False``, else the row of ``trainer.v1.trainer_mode`` (verl's default sync where absent)."""
    trainer = _get(config, "trainer")
    if not bool(_get(trainer, "use_v1", True)):
        return LEGACY_TRAINER
    return trainer_mode_named(_get(_get(trainer, "v1"), "trainer_mode"))


def trainer_mode_named(name: Any) -> TrainerMode:
    """The row of ``trainer.v1.trainer_mode=name`` (None or empty: verl's default; ValueError listing the choices)."""
    return _row(TRAINER_MODES, TRAINER_MODE_KEY, str(name or DEFAULTS["trainer_mode"]))


def _get(node: Any, key: str, default: Any = None) -> Any:
    if node is None:
        return default
    return node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)


def reference(name: Any) -> Mode:
    """The row of ``policy_loss.reference=name`` (ValueError listing the choices)."""
    return _row(REFERENCES, "RPGPolicyLossConfig.reference", name)


def kl_control(name: Any) -> Mode:
    """The row of ``policy_loss.kl_control=name`` (ValueError listing the choices)."""
    return _row(KL_CONTROLS, "RPGPolicyLossConfig.kl_control", name)


def _row(rows: dict[str, Any], setting: str, name: Any) -> Any:
    if name not in rows:
        raise ValueError(f"{setting}={name!r} is not valid; choose one of {list(rows)}")
    return rows[name]


def selected(policy_loss: Mapping) -> tuple[Mode, Mode]:
    """(reference row, kl_control row) of a policy-loss mapping (DictConfig, dict or `RPGPolicyLossConfig`);
    absent settings take their defaults."""
    ref, ctl = (str(_get(policy_loss, s) or DEFAULTS[s]) for s in ("reference", "kl_control"))
    return reference(ref), kl_control(ctl)


def option_owner(option: str) -> Mode | None:
    """The row whose option `option` is, or None."""
    return next((m for m in ROWS if option in m.option_names), None)


def describe(row: Mode, settings: Any) -> str:
    """The dry-run summary's text of `row` with the run's β and option values (`settings`: the typed RPG settings,
    `RPGPolicyLossConfig`, whose fields hold the defaults)."""
    values = {n: getattr(settings, n) for n in OPTION_DEFAULTS}
    return row.describe.format(name=row.name, kl_coef=settings.kl_coef, **values)


def checkpoint_bytes(settings: Any, n_params: int, dtype_bytes: int) -> dict[str, float]:
    """Bytes the plugin adds to each checkpoint beyond verl's, by part: the reference weights (P × the reference
    engine's dtype bytes, all ranks' shards together) of a mode that writes them; {} otherwise (a few KB of JSON, or
    `settings` None: verl's own loss)."""
    if settings is None:
        return {}
    row, _ = selected(settings)
    return {row.checkpoint_label: float(n_params) * dtype_bytes} if row.checkpoint_label else {}


def smoke_overrides(settings: Any) -> tuple[list[str], bool]:
    """(overrides, check): what a smoke run adds so that every mode the run's typed RPG settings select acts at each
    of its steps (`settings` None, verl's own loss: nothing), and whether every rank checks each write of the
    reference weights (`VERIFY_ENV`)."""
    if settings is None:
        return [], False
    rows = selected(settings)
    return [o for row in rows for o in row.smoke], any(row.writes_reference for row in rows)


# ---------------------------------------------------------------------------------------------------------------------
# The checks of the options (RPGPolicyLossConfig, RefreshSchedule and AdaptiveKLCoef call them)
# ---------------------------------------------------------------------------------------------------------------------
def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_refresh_settings(
    every_steps: Any,
    kl_threshold: Any,
    ema_decay: Any,
    owner: str,
    names: tuple[str, str, str] = ("every_steps (K)", "kl_threshold (κ)", "ema_decay"),
    need_a_criterion: bool = True,
) -> None:
    """Raise ValueError naming `owner` and the setting when K is not an integer ≥ 0, κ not a finite number ≥ 0, the
    KL average's decay not in [0, 1), or (with `need_a_criterion`) neither K > 0 nor κ > 0."""
    k_name, kappa_name, decay_name = names
    if not _number(every_steps) or int(every_steps) != every_steps or every_steps < 0:
        raise ValueError(OPTIONS["ref_refresh_steps"].invalid(owner, every_steps, k_name))
    if not _number(kl_threshold) or not (math.isfinite(kl_threshold) and kl_threshold >= 0):
        raise ValueError(OPTIONS["ref_refresh_kl"].invalid(owner, kl_threshold, kappa_name))
    if not _number(ema_decay) or not (0.0 <= ema_decay < 1.0):
        raise ValueError(OPTIONS["ref_kl_ema"].invalid(owner, ema_decay, decay_name))
    if need_a_criterion and every_steps == 0 and kl_threshold == 0:
        raise ValueError(f"{owner} needs {k_name} > 0 and/or {kappa_name} > 0")


def check_ema_settings(decay: Any, period: Any, owner: str) -> None:
    """Raise ValueError naming `owner` and the setting when the EMA reference's τ (`ref_ema_decay`) is not in [0, 1)
    or its period P (`ref_ema_period`, optimizer steps) is not an integer ≥ 1."""
    if not _number(decay) or not (0.0 <= decay < 1.0):
        fix = " (τ = 1 never moves the reference: use reference=frozen)"
        raise ValueError(OPTIONS["ref_ema_decay"].invalid(owner, decay) + fix)
    if not _number(period) or int(period) != period or period < 1:
        raise ValueError(OPTIONS["ref_ema_period"].invalid(owner, period))


def check_kl_control_settings(target: Any, horizon: Any, owner: str, adaptive: bool, kl_coef: Any = None) -> None:
    """Raise ValueError naming `owner` and the setting when the adaptive-β controller's target is not a finite number
    (> 0 when `adaptive`, ≥ 0 otherwise), its horizon not a finite number > 0.2, or (`adaptive`) β's start `kl_coef`
    is 0 (a multiplicative controller never leaves 0)."""
    if not _number(target) or not math.isfinite(target) or target < 0 or (adaptive and target == 0):
        fix = f"select the mode with {KL_CONTROLS['adaptive'].whole_fix()} (docs/reference-modes.md#one-override)"
        raise ValueError(f"{OPTIONS['kl_target'].invalid(owner, target)}. It has no default: {fix}")
    if not _number(horizon) or not math.isfinite(horizon) or horizon <= MIN_HORIZON:
        raise ValueError(OPTIONS["kl_horizon"].invalid(owner, horizon))
    if adaptive and kl_coef is not None and not (_number(kl_coef) and kl_coef > 0):
        raise ValueError(
            f"{owner}: kl_control='adaptive' starts β at kl_coef and multiplies it each step, so kl_coef must be > 0, "
            f"got {kl_coef!r}"
        )


def check_settings(settings: Any, owner: str = "RPGPolicyLossConfig") -> None:
    """Check the mode choices and every mode option of an `RPGPolicyLossConfig` (ValueError naming the setting)."""
    ref, ctl = reference(settings.reference), kl_control(settings.kl_control)
    try:
        check_refresh_settings(
            settings.ref_refresh_steps,
            settings.ref_refresh_kl,
            settings.ref_kl_ema,
            owner=owner + (f".reference={ref.name!r}" if ref.needs_a_trigger else ""),
            names=("ref_refresh_steps (K)", "ref_refresh_kl (κ)", "ref_kl_ema"),
            need_a_criterion=ref.needs_a_trigger,
        )
    except ValueError as e:
        if not ref.needs_a_trigger:
            raise
        raise ValueError(f"{e}. Select the mode with {ref.whole_fix()} (docs/reference-modes.md#one-override)") from e
    check_ema_settings(settings.ref_ema_decay, settings.ref_ema_period, owner)
    target, horizon = settings.kl_target, settings.kl_horizon
    check_kl_control_settings(target, horizon, owner, adaptive=ctl.moves_beta, kl_coef=settings.kl_coef)
