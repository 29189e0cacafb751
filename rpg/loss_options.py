"""The RPG options: the settings `rpg.RPGPolicyLossConfig` adds to verl's `PolicyLossConfig`, their types, defaults
and meaning, in a dataclass that imports nothing but the standard library.

`rpg.loss_config.RPGPolicyLossConfig` is `RPGOptions` + verl's `PolicyLossConfig` (and validates every field), so the
fields are declared once, here; the launcher's early checks (`rpg.preflight.early`, before verl is imported) and the
composition (`rpg.preflight.compose`) read the option names from this class. Every default is the paper's choice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from rpg import modes  # the run-mode table: the mode and estimator options' defaults


@dataclass
class RPGOptions:
    """The options of the RPG losses (the rows of `rpg.loss_table.LOSSES`, `python -m rpg.launch --list`); validated
    when `rpg.RPGPolicyLossConfig` is built.

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
        base_loss_mode: the verl policy loss the KL add-on `rpg_kl_<div>` runs beside (`rpg.addon_bases.BASES`;
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
        kl_target: the target of the adaptive controller, in the units of the KL the loss regularises (per token:
            ``actor/rpg/kl``, the chosen divergence to the reference, with kl_estimator='sampled'; ``actor/rpg/topk_kl``
            with 'topk'; docs/losses.md#adaptive-beta); > 0 with kl_control='adaptive'.
        kl_horizon: H, in training steps: each step multiplies β by 1 + clip(KL/target − 1, −0.2, 0.2)/H (verl's
            horizon counts sequences: H = verl's horizon / sequences per step). A finite number > 0.2.
        kl_estimator: how the per-token KL is estimated: "sampled" (the paper's: from the one sampled token, with the
            exact importance weights) or "topk" (computed from the current logits on a support of `kl_topk` tokens
            per position, plus a tail; docs/losses.md#topk-kl). The direction follows the loss's divergence row
            (reverse for rkl/urkl, forward for fkl/ufkl); the support is π_old's top-k (iterative reference) or
            π_ref's (frozen/periodic/EMA), selected in the pass that computes those log-probs.
        kl_topk: k, the support's width (kl_estimator='topk'): an integer ≥ 1, at most the vocabulary. The support
            costs 8·k bytes per token (int32 ids + fp32 log-probs) between the log-prob passes and the update.
        kl_topk_tail: the tail outside the support (kl_estimator='topk'): "sampled" (1[y∉S]·w·log(p_y/q_y), or
            ρ·log(q_y/p_y) forward: unbiased in value and gradient) or "bucket" (the tail as one token: a lower bound,
            biased by −p_T·KL(p(·|T)‖q(·|T)), forward −q_T·KL(q(·|T)‖p(·|T))).
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
    kl_estimator: str = modes.DEFAULTS["kl_estimator"]
    kl_topk: int = modes.OPTION_DEFAULTS["kl_topk"]
    kl_topk_tail: str = modes.OPTION_DEFAULTS["kl_topk_tail"]


def option_defaults() -> dict[str, Any]:
    """The RPG options (the fields RPGPolicyLossConfig adds to verl's PolicyLossConfig) and their defaults, in
    declaration order."""
    return {f.name: f.default for f in dataclasses.fields(RPGOptions)}


def option_names() -> tuple[str, ...]:
    """The RPG options' names, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(RPGOptions))
