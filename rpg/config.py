"""Configuration of the RPG policy losses.

`RPGPolicyLossConfig` extends verl's `PolicyLossConfig`, so it sits exactly where verl expects the policy-loss
settings and travels to every actor worker with the rest of the actor config:

    actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_urkl
    +actor_rollout_ref.actor.policy_loss.kl_coef=1e-4

Clip ratios are *not* duplicated here: they are verl's own actor fields (`clip_ratio_low`, `clip_ratio_high`,
`clip_ratio_c`). Every default below is the paper's choice; the reference implementation's behaviour is available
through the documented options (see README, "Differences from the authors' code").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from verl.workers.config import PolicyLossConfig

BRANCH_ON = ("effective_advantage", "advantage")
KL_RATIO = ("clipped", "raw")
KL_PLACEMENT = ("additive", "inside_clip")
REFERENCE_MODES = ("iterative", "frozen", "periodic")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"RPGPolicyLossConfig.{name}={value!r} is not valid; choose one of {list(choices)}")


@dataclass
class RPGPolicyLossConfig(PolicyLossConfig):
    """Settings of the RPG losses (`rpg_<div>`, `rpg_reinforce_<div>`, `rpg_reinforce_hardclip_<div>`).

    Args:
        kl_coef: β, the KL coefficient of `J = E[R] − β·D` (paper §5: 1e-4). Must be finite and ≥ 0.
        kl_clamp: if set, clamp the per-token KL surrogate of the fully differentiable family to
            [−kl_clamp, kl_clamp] as the authors' code does (10.0 there). The paper has no clamp: None.
            torch.clamp has zero gradient where it saturates, so this changes the gradient where the KL is large.
        branch_on: which sign selects the dual-clip branch of Algorithm 2 (RPG-REINFORCE):
            "effective_advantage" (paper: ψ = A'·ℓ, A' = A + C_KL/w) or "advantage" (authors' code: sign of A).
        kl_ratio: ratio at which the REINFORCE KL component C_KL is evaluated: "clipped" (w̄ = clip(w, 1−ε1, 1+ε2),
            Remark F.2, as the authors do) or "raw" (w, the exact estimator of Props. F.1–F.5).
        kl_placement: where the KL sits in the fully differentiable family: "additive" (dual-clip PPO on the
            detached A plus an unclipped β·D̂ — SPEC §4.2.2, the authors' construction, exact gradients of
            Tables 1/4 inside the trust region) or "inside_clip" (literal Algorithm 1: dual-clip on a θ-dependent
            Â = A − β·D̂/w, which reproduces Tables 1/4 exactly when unclipped — SPEC §4.2.3).
        reference: KL reference policy. "iterative" (π_ref = π_old, no reference model; paper §5 and every RPG
            script), "frozen" (the initial model computed by verl's reference worker), "periodic" (a reference
            refreshed from the policy every `ref_refresh_steps` optimizer steps and/or when the EMA of the token
            KL to the reference exceeds `ref_refresh_kl`). Non-iterative modes use the ρ-weighted surrogates of
            SPEC §6.2 (ρ = π_ref/π_old) and need `actor.use_kl_loss=True` with `kl_loss_coef=0` so that verl
            builds the reference model and ships `ref_log_prob`.
        ref_refresh_steps: K of the periodic reference, in optimizer steps (0 = never on a step count). verl
            computes ref_log_prob once per training step, so a refresh happens at the end of the first training
            step with ≥ K optimizer steps since the last one (rpg.reference).
        ref_refresh_kl: κ of the periodic reference (0 = never on a KL threshold).
        ref_kl_ema: decay per training step of the moving average of the token KL compared with κ; the average
            restarts at each refresh.
    """

    kl_coef: float = 1e-4
    kl_clamp: Optional[float] = None
    branch_on: str = "effective_advantage"
    kl_ratio: str = "clipped"
    kl_placement: str = "additive"
    reference: str = "iterative"
    ref_refresh_steps: int = 0
    ref_refresh_kl: float = 0.0
    ref_kl_ema: float = 0.9

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
        if int(self.ref_refresh_steps) != self.ref_refresh_steps or self.ref_refresh_steps < 0:
            raise ValueError(
                f"RPGPolicyLossConfig.ref_refresh_steps must be an integer ≥ 0, got {self.ref_refresh_steps!r}"
            )
        if not (math.isfinite(self.ref_refresh_kl) and self.ref_refresh_kl >= 0):
            raise ValueError(f"RPGPolicyLossConfig.ref_refresh_kl must be ≥ 0, got {self.ref_refresh_kl!r}")
        if not (0.0 <= self.ref_kl_ema < 1.0):
            raise ValueError(f"RPGPolicyLossConfig.ref_kl_ema must be in [0, 1), got {self.ref_kl_ema!r}")
        if self.reference == "periodic" and self.ref_refresh_steps == 0 and self.ref_refresh_kl == 0:
            raise ValueError(
                "RPGPolicyLossConfig.reference='periodic' needs ref_refresh_steps > 0 (K) and/or ref_refresh_kl > 0 (κ)"
            )
        if self.loss_mode.startswith("rpg") and self.rollout_correction.get("bypass_mode", False):
            raise ValueError(BYPASS_ERROR)


BYPASS_ERROR = (
    "RPG losses cannot run with algorithm.rollout_correction.bypass_mode=True: bypass mode replaces the actor's "
    "old log-probs by the rollout engine's (and the legacy trainer overwrites policy_loss.loss_mode with "
    "'bypass_mode'), so the RPG loss would silently not be the one you selected. Use decoupled mode "
    "(bypass_mode=False) with algorithm.rollout_correction.rollout_is=token for TIS weights."
)


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
    key = id(pl)
    cached = _MAPPING_CACHE.get(key)
    if cached is not None and cached[0] is pl:
        return cached[1]
    known = set(RPGPolicyLossConfig.__dataclass_fields__) - {"_target_"}
    kwargs = {k: pl[k] for k in pl.keys() if k in known}
    unknown = sorted(set(pl.keys()) - known - {"_target_"})
    if unknown:
        raise ValueError(f"Unknown policy_loss keys {unknown}; valid keys are {sorted(known)}")
    cfg = RPGPolicyLossConfig(**kwargs)
    _MAPPING_CACHE[key] = (pl, cfg)
    return cfg


_MAPPING_CACHE: dict[int, tuple[Any, RPGPolicyLossConfig]] = {}


def clip_settings(actor_config: Any) -> tuple[float, float, float]:
    """(ε1, ε2, c) from verl's actor fields, validated (ε1 ∈ (0, 1), ε2 > 0, c > 1)."""
    clip_ratio = actor_config.get("clip_ratio", 0.2)
    low = actor_config.get("clip_ratio_low", None)
    high = actor_config.get("clip_ratio_high", None)
    low = clip_ratio if low is None else low
    high = clip_ratio if high is None else high
    c = actor_config.get("clip_ratio_c", 3.0)
    if not (0.0 < low < 1.0):
        raise ValueError(f"actor.clip_ratio_low (ε1) must be in (0, 1), got {low!r}")
    if not (high > 0.0):
        raise ValueError(f"actor.clip_ratio_high (ε2) must be > 0, got {high!r}")
    if not (c > 1.0):
        raise ValueError(f"actor.clip_ratio_c (dual-clip c) must be > 1, got {c!r}")
    return float(low), float(high), float(c)
