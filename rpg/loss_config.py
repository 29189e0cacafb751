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
from rpg.loss_table import LOSSES, RPG_POLICY_LOSS_TARGETS, LossSpec, base_loss_error, loss_spec  # noqa: F401
from rpg import modes

BRANCH_ON = ("effective_advantage", "advantage")
KL_RATIO = ("clipped", "raw")
KL_PLACEMENT = ("additive", "inside_clip")
REFERENCE_MODES = tuple(modes.REFERENCES)  # the rows of the run-mode table (rpg.modes)
KL_CONTROLS = tuple(modes.KL_CONTROLS)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"RPGPolicyLossConfig.{name}={value!r} is not valid; choose one of {list(choices)}")


@dataclass
class RPGPolicyLossConfig(PolicyLossConfig):
    """Settings of the RPG losses (the rows of `rpg.loss_table.LOSSES`, `python -m rpg.launch --list`).

    Args:
        kl_coef: β, the KL coefficient of `J = E[R] − β·D` (paper App. H: 1e-4). Must be finite and ≥ 0.
        kl_clamp: if set, clamp the per-token KL surrogate of the fully differentiable family to
            [−kl_clamp, kl_clamp] as the authors' code does (10.0 there, all divergences but FKL). The paper has no
            clamp: None.
            torch.clamp has zero gradient where it saturates, so this changes the gradient where the KL is large.
        branch_on: which sign selects the dual-clip branch of Algorithm 2 (RPG-REINFORCE):
            "effective_advantage" (paper: ψ = A'·ℓ, A' = A + C_KL/w) or "advantage" (authors' code: sign of A).
        kl_ratio: ratio at which the REINFORCE KL component C_KL is evaluated: "clipped" (w̄ = clip(w, 1−ε1, 1+ε2),
            Remark F.2, as the authors do) or "raw" (w, the exact estimator of Props. F.1–F.5).
        kl_placement: where the KL sits in the fully differentiable family: "additive" (dual-clip PPO on the
            detached A plus an unclipped β·D̂ — docs/losses.md#additive, the authors' construction, exact gradients of
            Tables 1/4 inside the trust region) or "inside_clip" (literal Algorithm 1: dual-clip on a θ-dependent
            Â = A − β·D̂/w, which reproduces Tables 1/4 exactly when unclipped — docs/losses.md#inside-clip).
        reference: KL reference policy. "iterative" (π_ref = π_old, no reference model; paper §5 and every RPG script),
            "frozen" (the initial model computed by verl's reference worker), "periodic" (a reference refreshed from the
            policy every `ref_refresh_steps` optimizer steps and/or when the EMA of the token KL to the reference
            exceeds `ref_refresh_kl`), "ema" (π_ref ← τ·π_ref + (1 − τ)·π_θ every `ref_ema_period` optimizer steps,
            τ = `ref_ema_decay`; EMA-PG, arXiv 2602.04417). Non-iterative modes use the ρ-weighted surrogates of
            docs/losses.md#rho-weighting (ρ = π_ref/π_old) and need `actor.use_kl_loss=True` with `kl_loss_coef=0`
            so that verl builds the reference model and ships `ref_log_prob`.
        ref_refresh_steps: K of the periodic reference, in optimizer steps (0 = never on a step count). verl
            computes ref_log_prob once per training step, so a refresh happens at the end of the first training
            step with ≥ K optimizer steps since the last one (rpg.reference).
        ref_refresh_kl: κ of the periodic reference (0 = never on a KL threshold).
        ref_kl_ema: decay per training step of the moving average of the token KL compared with κ; the average
            restarts at each refresh.
        base_loss_mode: the verl policy loss the KL add-on `rpg_kl_<div>` runs beside (`rpg.loss_table.ADDON_BASES`;
            docs/losses.md#kl-addon).
        kl_credit: "token" (the per-token KL at the sampled histories, every published RPG number) or "sequence" (the
            gradient of the KL between whole responses, docs/losses.md#kl-credit), for the add-on and the REINFORCE
            families.
        ref_ema_decay: τ of the EMA (Polyak) reference (``reference='ema'``): π_ref ← τ·π_ref + (1 − τ)·π_θ, in
            [0, 1) (τ = 0: the periodic reference with K = ref_ema_period; τ → 1: frozen). docs/reference-modes.md#ema.
        ref_ema_period: P, optimizer steps between two EMA updates (the unit of the periodic reference's K): the
            update happens at the end of the first training step with ≥ P optimizer steps since the last one.
        kl_control: "fixed" (β = kl_coef throughout) or "adaptive" (the proportional controller of Ziegler et al. 2019,
            as verl's AdaptiveKLController: β starts at kl_coef and is updated once per training step towards
            `kl_target`; docs/losses.md#adaptive-beta).
        kl_target: the target of the adaptive controller, in the units of the loss's own KL estimate
            (``actor/rpg/kl``: the chosen divergence to the reference, per token); > 0 with kl_control='adaptive'.
        kl_horizon: H, in training steps: each step multiplies β by 1 + clip(KL/target − 1, −0.2, 0.2)/H (verl's
            horizon counts sequences: H = verl's horizon / sequences per step). A finite number > 0.2.
    """

    kl_coef: float = 1e-4
    kl_clamp: Optional[float] = None
    branch_on: str = "effective_advantage"
    kl_ratio: str = "clipped"
    kl_placement: str = "additive"
    reference: str = modes.DEFAULTS["reference"]
    ref_refresh_steps: int = modes.OPTION_DEFAULTS["ref_refresh_steps"]
    ref_refresh_kl: float = modes.OPTION_DEFAULTS["ref_refresh_kl"]
    ref_kl_ema: float = modes.OPTION_DEFAULTS["ref_kl_ema"]
    base_loss_mode: str = "vanilla"
    kl_credit: str = "token"
    ref_ema_decay: float = modes.OPTION_DEFAULTS["ref_ema_decay"]
    ref_ema_period: int = modes.OPTION_DEFAULTS["ref_ema_period"]
    kl_control: str = modes.DEFAULTS["kl_control"]
    kl_target: float = modes.OPTION_DEFAULTS["kl_target"]
    kl_horizon: float = modes.OPTION_DEFAULTS["kl_horizon"]

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
        modes.check_settings(self)  # every option of the reference and KL-control rows
        ineffective = ineffective_options(self)
        if ineffective:
            raise ValueError("; ".join(ineffective))
        if self.spec is not None and (bypass := bypass_error(self.rollout_correction)):
            raise ValueError(bypass)

    @property
    def spec(self) -> Optional[LossSpec]:
        """The loss-table row of `loss_mode` (`rpg.loss_table.LossSpec`), None for verl's own losses."""
        return loss_spec(self.loss_mode)

    @property
    def needs_ref_log_prob(self) -> bool:
        """True when the loss reads verl's `ref_log_prob`: a non-iterative reference, or a loss such as `grpo_wk3`."""
        return modes.reference(self.reference).reference_model or (
            self.spec is not None and self.spec.needs_reference
        )




def option_defaults() -> dict[str, Any]:
    """The RPG options (fields RPGPolicyLossConfig adds to verl's PolicyLossConfig) and their defaults."""
    verl_fields = set(PolicyLossConfig.__dataclass_fields__)
    return {n: f.default for n, f in RPGPolicyLossConfig.__dataclass_fields__.items() if n not in verl_fields}


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
        applies |= {"kl_control", *ctl.option_names}
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
        owner = modes.option_owner(name)
        if owner is not None and (spec is not None or owner.setting == "reference"):
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
