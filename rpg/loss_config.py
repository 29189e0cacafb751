"""Configuration of the RPG policy losses.

`RPGPolicyLossConfig` extends verl's `PolicyLossConfig`, so it sits exactly where verl expects the policy-loss
settings and travels to every actor worker with the rest of the actor config:

    actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_urkl
    +actor_rollout_ref.actor.policy_loss.kl_coef=1e-4

Clip ratios are *not* duplicated here: they are verl's own actor fields (`clip_ratio_low`, `clip_ratio_high`,
`clip_ratio_c`), validated per loss by `clip_settings`. Every default below is the paper's choice and is defined only
here; the reference implementation's behaviour is available through the documented options (see README,
"Differences from the authors' code").

Building the config validates every field and, against the loss table (`rpg.loss_table.LOSSES`), refuses an option
that cannot change the chosen loss or reference mode (`ineffective_options`) and bypass mode of the legacy trainer for
an RPG loss. It is a plain value: building one changes nothing outside it. What a reference mode needs from verl (the
ref_log_prob adapter, the periodic-reference hooks) is installed by `rpg.install`, the one installation point, in
every process whose environment names it (`RPG_INSTALL`, set by the launcher for the whole run); `needs_ref_log_prob`
and `reference` say what that is (`rpg.install.needed`). The launcher builds the config at compose time and verl builds
it in every actor worker (`ActorRolloutRefWorker.init_model`), so the checks run before training starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from verl.workers.config import ActorConfig, PolicyLossConfig

from rpg.kl_credit import KL_CREDIT
from rpg.loss_options import RPGOptions, option_defaults  # noqa: F401  (option_defaults: public here too)
from rpg.loss_table import LOSSES, RPG_POLICY_LOSS_TARGETS, LossSpec, base_loss_error, loss_spec  # noqa: F401
from rpg import modes

BRANCH_ON = ("effective_advantage", "advantage")
KL_RATIO = ("clipped", "raw")
KL_PLACEMENT = ("additive", "inside_clip")
REFERENCE_MODES = tuple(modes.REFERENCES)  # the rows of the run-mode table (rpg.modes)
KL_CONTROLS = tuple(modes.KL_CONTROLS)
KL_ESTIMATORS = tuple(modes.ESTIMATORS)  # docs/losses.md#topk-kl
KL_TOPK_TAILS = tuple(modes.TOPK_TAILS)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"RPGPolicyLossConfig.{name}={value!r} is not valid; choose one of {list(choices)}")


@dataclass
class RPGPolicyLossConfig(RPGOptions, PolicyLossConfig):
    """verl's `PolicyLossConfig` plus the RPG options (`rpg.loss_options.RPGOptions`: each option, its default and
    its meaning; first in the bases so that the fields keep verl's order, then RPG's). Building one validates every
    field against the loss table (`rpg.loss_table.LOSSES`, `python -m rpg.launch --list`)."""

    def __post_init__(self):
        if not (isinstance(self.kl_coef, (int, float)) and math.isfinite(self.kl_coef) and self.kl_coef >= 0):
            raise ValueError(f"RPGPolicyLossConfig.kl_coef (β) must be a finite number ≥ 0, got {self.kl_coef!r}")
        if self.kl_clamp is not None and not (math.isfinite(self.kl_clamp) and self.kl_clamp > 0):
            raise ValueError(
                f"RPGPolicyLossConfig.kl_clamp must be None (paper: no clamp) or a positive number "
                f"(authors' code: 10.0), got {self.kl_clamp!r}"
            )
        _choice("branch_on", self.branch_on, BRANCH_ON)
        _choice("kl_ratio", self.kl_ratio, KL_RATIO)
        _choice("kl_placement", self.kl_placement, KL_PLACEMENT)
        _choice("reference", self.reference, REFERENCE_MODES)
        _choice("kl_credit", self.kl_credit, KL_CREDIT)
        if (base_error := base_loss_error(self.base_loss_mode)) is not None:
            raise ValueError(f"RPGPolicyLossConfig: {base_error}")
        _choice("kl_control", self.kl_control, KL_CONTROLS)
        _choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice("kl_topk_tail", self.kl_topk_tail, KL_TOPK_TAILS)
        if isinstance(self.kl_topk, bool) or not isinstance(self.kl_topk, int) or self.kl_topk < 1:
            raise ValueError(
                f"RPGPolicyLossConfig.kl_topk={self.kl_topk!r}: the top-k KL support holds k distinct token ids per "
                f"position, so k must be {modes.OPTIONS['kl_topk'].valid}; the recipes' choice is 64"
            )
        modes.check_settings(self)  # every option of the reference and KL-control rows
        refused = ineffective_options(self) + topk_errors(self)
        if refused:
            raise ValueError("; ".join(refused))
        if self.spec is not None and (bypass := bypass_error(self.rollout_correction)):
            raise ValueError(bypass)

    @property
    def spec(self) -> Optional[LossSpec]:
        """The loss-table row of `loss_mode` (`rpg.loss_table.LossSpec`), None for verl's own losses."""
        return loss_spec(self.loss_mode)

    @property
    def estimator(self) -> modes.Estimator:
        """The row of `kl_estimator` (`rpg.modes.ESTIMATORS`)."""
        return modes.estimator(self.kl_estimator)

    @property
    def topk(self) -> bool:
        """True when the loss's KL is the top-k KL (an RPG loss whose estimator row has a support,
        docs/losses.md#topk-kl)."""
        return self.spec is not None and self.estimator.support

    @property
    def needs_ref_log_prob(self) -> bool:
        """True when the loss reads verl's `ref_log_prob`: a non-iterative reference, or a loss such as `grpo_wk3`."""
        return modes.reference(self.reference).reference_model or (
            self.spec is not None and self.spec.needs_reference
        )


def ineffective_options(settings: RPGPolicyLossConfig) -> list[str]:
    """One message per RPG option set to a non-default value that cannot change the chosen loss or reference mode.

    Which options change which loss is the loss table's `LossSpec.options`; the `ref_refresh_*` options act only with
    `reference=periodic`, which (like any other option) does nothing for a verl loss unless it is `periodic`
    (refreshing verl's own reference model). Refused rather than warned: a setting that silently does nothing in a
    day-long run is a mistake the user wants to hear about before it starts.
    """
    spec = settings.spec
    ref, ctl = modes.reference(settings.reference), modes.kl_control(settings.kl_control)
    applies = set(spec.options) if spec is not None else set()
    if ref.writes_reference:  # also for verl's own losses: it moves verl's reference model
        applies |= {"reference", *ref.option_names}
    if spec is not None:
        applies |= {"kl_control", *ctl.option_names, "kl_estimator", *settings.estimator.option_names}
    where = f"loss_mode={settings.loss_mode!r}" if spec is not None else f"verl's loss_mode={settings.loss_mode!r}"
    messages = []
    reverse = spec is not None and spec.divergence.reverse
    if spec is not None and settings.kl_credit == "sequence" and not reverse and not ref.reference_model:
        messages.append(
            f"actor_rollout_ref.actor.policy_loss.kl_credit='sequence' has no effect on {where} with "
            "reference='iterative': a forward divergence's history follows π_ref = π_old, so its sequence-level "
            "gradient is the token one (docs/losses.md#kl-credit). Remove it, or choose a reverse divergence (rkl, urkl) "
            "or a frozen/periodic reference"
        )
    for name, default in option_defaults().items():
        value = getattr(settings, name)
        if name in applies or value == default:
            continue
        owner, estimator = modes.option_owner(name), modes.estimator_option_owner(name)
        if estimator is not None and spec is not None:
            why = f"it acts only with kl_estimator={estimator.name!r} (kl_estimator={settings.kl_estimator!r})"
        elif owner is not None and (spec is not None or owner.setting == "reference"):
            now = getattr(settings, owner.setting)
            why = f"it acts only with {owner.setting}={owner.name!r} ({owner.setting}={now!r})"
        elif owner is not None or name == "kl_control":
            why = "the adaptive β drives the RPG losses' kl_coef; verl's own losses have none (verl's kl_loss_coef)"
        elif spec is None:
            why = "verl's own losses read no RPG option (reference='periodic' refreshes verl's reference model)"
        else:
            users = [s.name for s in LOSSES.values() if name in s.options]
            why = f"it changes only {', '.join(users)}"
        messages.append(
            f"actor_rollout_ref.actor.policy_loss.{name}={value!r} has no effect on {where}: {why}. Remove it "
            f"(default {default!r}) or choose a loss or reference mode it applies to"
        )
    return messages


def topk_errors(settings: RPGPolicyLossConfig) -> list[str]:
    """One message per setting of an RPG loss that cannot be combined with the top-k KL (kl_estimator='topk'):
    the analytic KL is a vector over the support, not a function of the sampled token's ratio, so it has no per-token
    KL weight C_KL to branch on or clip (docs/losses.md#topk-refused); it sits outside the clip as β·K per token."""
    if not settings.topk:
        return []
    spec, out, where = settings.spec, [], f"kl_estimator='topk' with loss_mode={settings.loss_mode!r}"
    fix = "; or keep kl_estimator='sampled' (the paper's estimator)"
    if "branch_on" in spec.options and settings.branch_on == "effective_advantage":
        out.append(
            f"actor_rollout_ref.actor.policy_loss.branch_on='effective_advantage' cannot run with {where}: the "
            "effective advantage A' = A + C_KL/w needs the KL gradient along ∇log π_θ(y), and the analytic KL's "
            "gradient is a vector over the support, so there is no per-token C_KL (docs/losses.md#topk-refused). Set "
            f"+actor_rollout_ref.actor.policy_loss.branch_on=advantage (the clip follows A, the KL sits outside it){fix}"
        )
    if settings.kl_placement == "inside_clip":
        out.append(
            f"actor_rollout_ref.actor.policy_loss.kl_placement='inside_clip' cannot run with {where}: the literal "
            "Algorithm 1 clips β·T(w, ρ)/w, a function of the sampled token's ratio only, which the analytic KL is not "
            f"(docs/losses.md#topk-refused). Remove it (kl_placement='additive': the KL outside the clip){fix}"
        )
    if settings.kl_clamp is not None:
        out.append(
            f"actor_rollout_ref.actor.policy_loss.kl_clamp={settings.kl_clamp!r} cannot run with {where}: it clamps "
            "the one-sample surrogate D̂(w), which the top-k KL replaces (its log-ratios are guarded at ±60 instead; "
            f"docs/losses.md#topk-costs). Remove it (default None){fix}"
        )
    if "kl_ratio" in spec.options and settings.kl_ratio != "clipped":
        out.append(
            f"actor_rollout_ref.actor.policy_loss.kl_ratio={settings.kl_ratio!r} has no effect with {where}: it sets "
            "the ratio at which the one-sample C_KL is evaluated, and the top-k KL has no C_KL. Remove it (default "
            f"'clipped'){fix}"
        )
    return out


BYPASS_ERROR = (
    "RPG losses cannot run with algorithm.rollout_correction.bypass_mode=True in verl's legacy trainer "
    "(trainer.use_v1=False): its apply_bypass_mode overwrites policy_loss.loss_mode with 'bypass_mode', so the RPG "
    "loss would silently not be the one you selected. Use the v1 trainer (trainer.use_v1=True, verl's default), where "
    "bypass mode takes π_old from the rollout's log-probs and the RPG loss runs (docs/async.md#bypass), or decoupled "
    "mode (bypass_mode=False) with algorithm.rollout_correction.rollout_is=token for TIS weights."
)


def bypass_error(rollout_correction: Any) -> Optional[str]:
    """BYPASS_ERROR if verl's rollout-correction settings select bypass mode, else None. Used where bypass can only
    come from the legacy trainer: there `apply_bypass_mode` copies the settings into `policy_loss.rollout_correction`
    (and rewrites loss_mode); the v1 trainer never does (the launcher's rule reads `trainer.use_v1`)."""
    return BYPASS_ERROR if (rollout_correction or {}).get("bypass_mode", False) else None


def rpg_settings(actor_config: Any) -> RPGPolicyLossConfig:
    """Return the RPG settings carried by verl's actor config.

    Accepts the typed `ActorConfig` verl builds in its workers (whose `policy_loss` is an `RPGPolicyLossConfig`
    when the recipe sets `_target_`) or a plain mapping (DictConfig/dict) with the same keys, as tests and the
    legacy trainer may pass. A plain verl `PolicyLossConfig` is refused with the override that fixes it.
    """
    pl = actor_config.get("policy_loss", None) if hasattr(actor_config, "get") else None
    if isinstance(pl, RPGPolicyLossConfig):
        return pl
    if pl is None or isinstance(pl, PolicyLossConfig):
        raise ValueError(
            "RPG loss modes need the RPG policy-loss config: add the Hydra override "
            "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig "
            f"(got policy_loss of type {type(pl).__name__})"
        )
    known = set(RPGPolicyLossConfig.__dataclass_fields__) - {"_target_"}
    kwargs = {k: pl[k] for k in pl.keys() if k in known}
    unknown = sorted(set(pl.keys()) - known - {"_target_"})
    if unknown:
        raise ValueError(f"Unknown policy_loss keys {unknown}; valid keys are {sorted(known)}")
    return RPGPolicyLossConfig(**kwargs)

# The clip fields are verl's (ActorConfig); each is checked only for the losses that read it
# (rpg.loss_table.clip_fields).
_CLIP_RULES = {
    "clip_ratio_low": (lambda v: 0.0 < v < 1.0, "must be in (0, 1): the ratio clip's lower end is 1 − ε1 > 0"),
    "clip_ratio_high": (lambda v: v > 0.0, "must be > 0: the ratio clip's upper end is 1 + ε2"),
    "clip_ratio_c": (lambda v: v > 1.0, "must be > 1: the dual-clip bound c caps the ratio of negative advantages"),
}


def _clip_value(actor_config: Any, name: str) -> tuple[Any, str]:
    """(value, note) of a clip field; ε1/ε2 fall back to `clip_ratio` as verl's losses do, defaults are verl's."""
    defaults = ActorConfig.__dataclass_fields__
    value = actor_config.get(name, defaults[name].default)
    if value is None and name in ("clip_ratio_low", "clip_ratio_high"):
        return actor_config.get("clip_ratio", defaults["clip_ratio"].default), " (from clip_ratio)"
    return value, ""


def clip_errors(actor_config: Any, fields: tuple[str, ...], loss_mode: str) -> list[str]:
    """One message per clip field in `fields` whose value `loss_mode` cannot use."""
    errors = []
    for name in fields:
        value, note = _clip_value(actor_config, name)
        ok, rule = _CLIP_RULES[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and ok(value)):
            errors.append(f"actor_rollout_ref.actor.{name}={value}{note} {rule} (read by loss_mode={loss_mode!r})")
    return errors


def clip_settings(actor_config: Any, fields: tuple[str, ...], loss_mode: str) -> tuple[float, float, float]:
    """(ε1, ε2, c) from verl's actor fields; the `fields` the loss reads are validated (ValueError naming them)."""
    errors = clip_errors(actor_config, fields, loss_mode)
    if errors:
        raise ValueError("; ".join(errors))
    return tuple(float(_clip_value(actor_config, n)[0]) for n in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c"))
