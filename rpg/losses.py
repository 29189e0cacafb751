"""RPG policy losses: the two loss families of the paper, built from the divergence table.

Conventions (SPEC §1): every response token is one sampled item `x = (h_t, y_t)`; tensors are (batch, response_len);
`w = π_θ/π_old` per token; `A` is the sequence advantage broadcast over the response (detached data); β = kl_coef;
`(ε1, ε2, c)` = verl's `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`. The KL reference is π_old (iterative,
ρ ≡ 1) unless `ref_log_prob` is given (ρ = π_ref/π_old, SPEC §6.2).

Families
--------
* **Fully differentiable RPG** (`rpg_<div>`, paper rows RPG-<DIV>; Tables 1/4, Algorithm 1):
  - `kl_placement="additive"` (default; SPEC §4.2.2, what the paper's experiments ran): dual-clip PPO (§3.3 / App.
    G.1) on the detached advantage plus the unclipped regulariser, per token
    `L = L_dualclip(w, A) + β·D̂(w)`; inside the trust region `∇L = −(w·A + C_KL)·∇log π_θ`, the exact gradient of
    Props. E.1, E.3, 3.2, 3.6.
  - `kl_placement="inside_clip"` (literal Algorithm 1): dual clip on the θ-dependent `Â = A − β·D̂(w)/w`, which
    makes `−w·Â` the exact Table 1/4 surrogate when unclipped (SPEC §4.2.3 table; the paper's own example Â's are
    the REINFORCE forms and are off by `+β·w·∇log π` per sample).
* **RPG-REINFORCE with RPG-Style Clip** (`rpg_reinforce_<div>`, Algorithm 2, Table 2 / App. F): per token with
  `ℓ = −log π_θ` (the only place the gradient enters), `C = β·C_KL` (at w̄ = clip(w) per Remark F.2 by default) and
  `A' = A + C/w`:

  | branch (ψ = A'·ℓ)          | loss value             | gradient                     |
  |----------------------------|------------------------|------------------------------|
  | A' ≥ 0, w < 1+ε2           | (w·A + C)·ℓ            | −(w·A + C)·∇log π_θ          |
  | A' ≥ 0, w ≥ 1+ε2           | ((1+ε2)·A + C)·SG(ℓ)   | 0                            |
  | A' < 0, w ≤ 1−ε1           | ((1−ε1)·A + C)·SG(ℓ)   | 0                            |
  | A' < 0, 1−ε1 < w < c       | (w·A + C)·ℓ            | −(w·A + C)·∇log π_θ          |
  | A' < 0, w ≥ c              | (c·A + C)·SG(ℓ)        | 0                            |

  (SPEC §4.3.2.) Its gradient equals dual-clip PPO on the detached `A'` (SPEC §4.3.4). The loss *value* is a
  log-prob scaled by a weight: do not compare `pg_loss` across families.
* **Hard-clip REINFORCE** (`rpg_reinforce_hardclip_<div>`, SPEC D6; the authors' `rpg_rf_<div>` without
  `clip_ppo`, script `rkl1e-4_rf`): `L = SG(w̄·A + C)·ℓ` for every token — truncated IS in both directions, no dual
  clip, no flat regions.

Numerics: log-ratios are masked to 0 on padding (padding may hold NaN/inf garbage) and limited to ±LOG_RATIO_GUARD
(exp(60) ≈ 1e26 is finite in fp32, and so are its products with log w); within the guard every formula is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from rpg.config import BYPASS_ERROR, RPGPolicyLossConfig, clip_settings, rpg_settings
from rpg.divergences import DIVERGENCES, Divergence

Tensor = torch.Tensor

LOG_RATIO_GUARD = 60.0

# Branch codes of the dual clip (both families), in the order of the table above.
BRANCHES = ("pos_grad", "pos_flat_high", "neg_flat_low", "neg_grad", "neg_flat_c")
POS_GRAD, POS_FLAT_HIGH, NEG_FLAT_LOW, NEG_GRAD, NEG_FLAT_C = range(5)


@dataclass(frozen=True)
class ClipParams:
    """Ratio clip of RPG-Style Clip: w̄ = clip(w, 1−ε1, 1+ε2); dual-clip bound c > 1 for negative advantages."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    c: float = 10.0


@dataclass
class TokenLoss:
    """Per-token loss matrix plus the detached quantities the metrics need (tensors are (bs, T)).

    Only `loss` is on the autograd graph. Metric-only quantities (branch codes, KL estimate) are derived lazily, on
    the valid tokens only, so that a training step pays for them once and cheaply.
    """

    loss: Tensor  # per-token loss, zero on padding
    w: Tensor  # detached importance ratio π_θ/π_old (1 on padding)
    log_w: Tensor  # detached log w (0 on padding)
    positive: Tensor  # bool: the dual-clip branch sign (A ≥ 0, Â ≥ 0 or A' ≥ 0 depending on the family/option)
    clip: ClipParams
    log_rho: Tensor | float = 0.0  # detached log ρ = log π_ref/π_old (0.0: iterative reference)
    rho: Tensor | float = 1.0
    kl_weight: Optional[Tensor] = None  # detached C/w (β included), when the family computed it

    @property
    def branch(self) -> Tensor:
        """int8 branch code per token (see BRANCHES)."""
        return dual_clip_branch(self.w, self.positive, self.clip)


# ---------------------------------------------------------------------------------------------------------------
# shared pieces
# ---------------------------------------------------------------------------------------------------------------
def masked_log_ratio(log_p: Tensor, log_q: Tensor, mask: Tensor) -> Tensor:
    """log(p/q) on valid tokens, 0 on padding (so NaN/inf garbage never reaches a gradient), guarded to ±60."""
    return torch.where(mask, log_p - log_q, 0.0).clamp_(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)


def reference_ratio(
    old_log_prob: Tensor, ref_log_prob: Optional[Tensor], mask: Tensor
) -> tuple[Tensor | float, Tensor | float]:
    """(log ρ, ρ) with ρ = π_ref/π_old, detached (SPEC §6.2); (0.0, 1.0) for the iterative reference."""
    if ref_log_prob is None:
        return 0.0, 1.0
    log_rho = masked_log_ratio(ref_log_prob.detach(), old_log_prob.detach(), mask)
    return log_rho, torch.exp(log_rho)


def dual_clip_branch(w: Tensor, positive: Tensor, clip: ClipParams) -> Tensor:
    """Branch code of the dual clip for a detached ratio `w` and the branch sign `positive` (bool)."""
    pos = (w >= 1.0 + clip.eps_high).to(torch.int8)  # POS_GRAD = 0, POS_FLAT_HIGH = 1
    neg = torch.where(w <= 1.0 - clip.eps_low, NEG_FLAT_LOW, torch.where(w < clip.c, NEG_GRAD, NEG_FLAT_C))
    return torch.where(positive, pos, neg.to(torch.int8))


def clipped_ratio(w: Tensor, positive: Tensor, clip: ClipParams) -> Tensor:
    """The ratio each dual-clip branch multiplies the advantage with: min(w, 1+ε2) for the positive branch,
    clip(w, 1−ε1, c) for the negative one (flat branches: the bound; gradient branches: w)."""
    return torch.where(positive, w.clamp(max=1.0 + clip.eps_high), w.clamp(1.0 - clip.eps_low, clip.c))


def dual_clip_pg_loss(w: Tensor, adv: Tensor, clip: ClipParams) -> Tensor:
    """Dual-clip PPO per token (paper §3.3, App. G.1; Ye et al. 2020), `adv` may carry a gradient.

    L_clip = max(−w·Â, −clip(w, 1−ε1, 1+ε2)·Â);  L = L_clip if Â ≥ 0 else min(L_clip, −c·Â),
    computed as the identical `−Â·min(w, 1+ε2)` (Â ≥ 0) / `−Â·clip(w, 1−ε1, c)` (Â < 0).
    """
    return -adv * clipped_ratio(w, adv >= 0, clip)


# ---------------------------------------------------------------------------------------------------------------
# the loss families (pure tensor functions)
# ---------------------------------------------------------------------------------------------------------------
def rpg_fully_differentiable(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    div: Divergence,
    beta: float,
    clip: ClipParams,
    kl_clamp: Optional[float] = None,
    kl_placement: str = "additive",
    ref_log_prob: Optional[Tensor] = None,
) -> TokenLoss:
    """RPG-<DIV>: fully differentiable surrogate with dual clip (Algorithm 1; SPEC §4.2.2 / §4.2.3).

    additive:    L = L_dualclip(w, SG(A)) + β·clamp?(D̂(w, ρ))
    inside_clip: L = L_dualclip(w, Â),  Â = A − β·D̂(w, ρ)/w   (gradient flows through w and Â)

    `kl_clamp` (authors' code: 10, all divergences but FKL) clamps D̂; None = paper.
    Shapes: all inputs (bs, T); `response_mask` bool. Every term is exactly 0 on padding (w = 1, A = 0, ρ = 1).
    """
    mask = response_mask.bool()
    log_w = masked_log_ratio(log_prob, old_log_prob.detach(), mask)
    w = torch.exp(log_w)
    log_rho, rho = reference_ratio(old_log_prob, ref_log_prob, mask)
    adv = torch.where(mask, advantages.detach(), 0.0)
    surrogate = div.surrogate(log_w, w, log_rho, rho)
    if kl_clamp is not None and div.reference_clamps:
        surrogate = surrogate.clamp(-kl_clamp, kl_clamp)
    if kl_placement == "additive":
        positive = adv >= 0
        loss = torch.addcmul(beta * surrogate, adv, clipped_ratio(w, positive, clip), value=-1.0)
    elif kl_placement == "inside_clip":
        adv_hat = adv - beta * surrogate / w
        positive = adv_hat.detach() >= 0
        loss = -adv_hat * clipped_ratio(w, positive, clip)
    else:
        raise ValueError(f"kl_placement={kl_placement!r}; choose 'additive' or 'inside_clip'")
    return TokenLoss(loss, w.detach(), log_w.detach(), positive, clip, log_rho, rho)


def rpg_reinforce(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    div: Divergence,
    beta: float,
    clip: ClipParams,
    branch_on: str = "effective_advantage",
    kl_ratio: str = "clipped",
    hard_clip: bool = False,
    ref_log_prob: Optional[Tensor] = None,
) -> TokenLoss:
    """RPG-REINFORCE with RPG-Style Clip (Algorithm 2; SPEC §4.3.3), or the hard-clip variant (SPEC D6).

    C = β·C_KL(w̄ or w, ρ) (Remark F.2: w̄ by default), A' = A + C/w, ℓ = −log π_θ;
    per-token loss `weight · ℓ` where the gradient flows only in the "grad" branches (table in the module doc).
    `branch_on="advantage"` branches on sign(A) with A = 0 negative, as the authors' code does (SPEC D4b).
    `hard_clip=True`: weight = w̄·A + C on every token, always with gradient.
    """
    mask = response_mask.bool()
    with torch.no_grad():
        log_w = masked_log_ratio(log_prob.detach(), old_log_prob, mask)
        w = torch.exp(log_w)
        log_rho, rho = reference_ratio(old_log_prob, ref_log_prob, mask)
        adv = torch.where(mask, advantages, 0.0)
        w_bar = w.clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high)
        if kl_ratio == "clipped":  # log w̄ = clip(log w) (log is monotonic)
            log_w_bar = log_w.clamp(math.log(1.0 - clip.eps_low), math.log(1.0 + clip.eps_high))
            kl_c = beta * div.kl_component(log_w_bar, w_bar, log_rho, rho)
        elif kl_ratio == "raw":
            kl_c = beta * div.kl_component(log_w, w, log_rho, rho)
        else:
            raise ValueError(f"kl_ratio={kl_ratio!r}; choose 'clipped' or 'raw'")
        kl_weight = kl_c / w  # C/w: A' = A + C/w (Algorithm 2 line 14 divides by the raw w)
        if branch_on == "effective_advantage":
            positive = adv + kl_weight >= 0
        elif branch_on == "advantage":
            positive = adv > 0
        else:
            raise ValueError(f"branch_on={branch_on!r}; choose 'effective_advantage' or 'advantage'")
        if hard_clip:
            weight = torch.addcmul(kl_c, w_bar, adv)
            has_grad = None
        else:
            weight = torch.addcmul(kl_c, clipped_ratio(w, positive, clip), adv)
            upper = torch.where(positive, w.new_tensor(1.0 + clip.eps_high), w.new_tensor(clip.c))
            has_grad = (w < upper) & (positive | (w > 1.0 - clip.eps_low))
    nll = torch.where(mask, -log_prob, 0.0)
    if has_grad is not None:
        nll = torch.where(has_grad, nll, nll.detach())
    loss = weight * nll
    return TokenLoss(loss, w, log_w, positive, clip, log_rho, rho, kl_weight)


# ---------------------------------------------------------------------------------------------------------------
# verl wiring: registered functions with verl 0.9.1's PolicyLossFn signature
# ---------------------------------------------------------------------------------------------------------------
def _metrics(out: TokenLoss, advantages: Tensor, mask: Tensor, div: Divergence, beta: float) -> dict[str, float]:
    """Dashboard metrics, computed on the valid tokens only with one host sync.

    actor/rpg/kl            mean per-token estimate of D(π_θ, π_ref) (k3-type, ≥ 0; see rpg.divergences)
    actor/rpg/frac_<branch> fraction of tokens in each dual-clip branch (BRANCHES)
    actor/rpg/kl_adv_abs    mean |C/w|: the KL part of the effective advantage A' = A + C/w (both families:
                            the fully differentiable KL term has gradient weight C_KL(w) per token)
    actor/rpg/kl_adv_rel    mean |C/w| / mean |A|
    actor/rpg/ratio_{mean,max,min}
    and verl's standard actor/ppo_kl, actor/pg_clipfrac (flat branches at 1±ε), actor/pg_clipfrac_lower (at c).
    """
    with torch.no_grad():
        idx = mask.reshape(-1).nonzero().squeeze(1)  # valid tokens, found once
        n = idx.numel()
        if n == 0:
            return {}

        def valid(x: Tensor | float) -> Tensor | float:
            return x.reshape(-1).index_select(0, idx) if isinstance(x, Tensor) else x

        w, log_w, pos = valid(out.w), valid(out.log_w), valid(out.positive)
        log_rho, rho = valid(out.log_rho), valid(out.rho)
        if out.kl_weight is not None:
            kl_weight = valid(out.kl_weight)
        else:
            kl_weight = div.kl_component(log_w, w, log_rho, rho).div_(w).mul_(beta)
        clip = out.clip
        n_pos = pos.sum()
        pos_flat = (pos & (w >= 1.0 + clip.eps_high)).sum()
        neg_low = (~pos & (w <= 1.0 - clip.eps_low)).sum()
        neg_c = (~pos & (w >= clip.c)).sum()
        kl_abs = kl_weight.abs().mean()
        stats = torch.stack(
            [
                (n_pos - pos_flat).to(w.dtype) / n,
                pos_flat.to(w.dtype) / n,
                neg_low.to(w.dtype) / n,
                (n - n_pos - neg_low - neg_c).to(w.dtype) / n,
                neg_c.to(w.dtype) / n,
                div.estimate(log_w, w, log_rho, rho).mean(),
                kl_abs,
                kl_abs / valid(advantages).abs().mean().clamp_min(1e-12),
                w.mean(),
                w.max(),
                w.min(),
                -log_w.mean(),
            ]
        )
        values = stats.tolist()
    b = dict(zip(BRANCHES, values[: len(BRANCHES)]))
    kl, kl_abs_v, kl_rel, r_mean, r_max, r_min, ppo_kl = values[len(BRANCHES) :]
    metrics = {f"actor/rpg/frac_{k}": v for k, v in b.items()}
    metrics.update(
        {
            "actor/rpg/kl": kl,
            "actor/rpg/kl_adv_abs": kl_abs_v,
            "actor/rpg/kl_adv_rel": kl_rel,
            "actor/rpg/ratio_mean": r_mean,
            "actor/rpg/ratio_max": r_max,
            "actor/rpg/ratio_min": r_min,
            "actor/ppo_kl": ppo_kl,
            "actor/pg_clipfrac": b["pos_flat_high"] + b["neg_flat_low"],
            "actor/pg_clipfrac_lower": b["neg_flat_c"],
        }
    )
    return metrics


def _ref_log_prob(settings: RPGPolicyLossConfig, requires_reference: bool, loss_name: str) -> Optional[Tensor]:
    """The reference log-probs of the current micro-batch, or None for the iterative reference (ρ ≡ 1)."""
    if settings.reference == "iterative" and not requires_reference:
        return None
    from rpg.reference import current_ref_log_prob

    ref = current_ref_log_prob()
    if ref is None:
        raise ValueError(
            f"{loss_name} with reference={settings.reference!r} needs the reference model's log-probs, but verl did "
            "not ship `ref_log_prob`. Set actor_rollout_ref.actor.use_kl_loss=True and "
            "actor_rollout_ref.actor.kl_loss_coef=0 (verl then builds the reference model and adds no KL of its own)."
        )
    return ref


def make_policy_loss(loss_name: str, family: str, div: Divergence, requires_reference: bool = False):
    """Build a verl `PolicyLossFn` for one (family, divergence) pair.

    The returned function has verl 0.9.1's signature `(old_log_prob, log_prob, advantages, response_mask,
    loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)`; `config` is verl's ActorConfig whose
    `policy_loss` is an `RPGPolicyLossConfig`. The per-token loss is multiplied by `rollout_is_weights` (verl's
    TIS correction of the rollout/π_old mismatch, as in verl's vanilla loss; it applies to the KL term too, whose
    expectation is also over π_old) and aggregated with verl's `agg_loss` over the global batch.
    """
    from verl.trainer.ppo.core_algos import agg_loss

    if family not in ("fd", "reinforce", "hardclip"):
        raise ValueError(f"unknown RPG loss family {family!r}")

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Optional[Tensor] = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        if config is None:
            raise ValueError(f"{loss_name} needs verl's actor config (clip ratios, policy_loss settings)")
        settings = rpg_settings(config)
        if settings.rollout_correction.get("bypass_mode", False):
            raise ValueError(BYPASS_ERROR)
        clip = ClipParams(*clip_settings(config))
        ref = _ref_log_prob(settings, requires_reference, loss_name)
        if family == "fd":
            out = rpg_fully_differentiable(
                log_prob, old_log_prob, advantages, response_mask, div, settings.kl_coef, clip,
                kl_clamp=settings.kl_clamp, kl_placement=settings.kl_placement, ref_log_prob=ref,
            )  # fmt: skip
        else:
            out = rpg_reinforce(
                log_prob, old_log_prob, advantages, response_mask, div, settings.kl_coef, clip,
                branch_on=settings.branch_on, kl_ratio=settings.kl_ratio, hard_clip=family == "hardclip",
                ref_log_prob=ref,
            )  # fmt: skip
        loss_mat = out.loss
        if rollout_is_weights is not None:
            loss_mat = loss_mat * torch.where(response_mask.bool(), rollout_is_weights, 0.0)
        batch_info = config.get("global_batch_info", None) or {}
        loss = agg_loss(loss_mat=loss_mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
        return loss, _metrics(out, advantages, response_mask, div, settings.kl_coef)

    policy_loss.__name__ = policy_loss.__qualname__ = f"compute_policy_loss_{loss_name}"
    policy_loss.__doc__ = f"verl policy loss `{loss_name}` ({family} family, {div.paper_name}: {div.objective})."
    return policy_loss


def loss_table() -> dict[str, tuple[str, Divergence, bool]]:
    """Every registered RPG loss name → (family, divergence, requires a reference model)."""
    table: dict[str, tuple[str, Divergence, bool]] = {}
    for div in DIVERGENCES.values():
        table[f"rpg_{div.name}"] = ("fd", div, False)
        table[f"rpg_reinforce_{div.name}"] = ("reinforce", div, False)
        table[f"rpg_reinforce_hardclip_{div.name}"] = ("hardclip", div, False)
    # GRPO's KL made exact (SPEC §5.3): dual-clip PPO + β·w·k3(π_ref/π_θ) against a frozen/periodic reference model.
    table["grpo_wk3"] = ("fd", DIVERGENCES["urkl"], True)
    return table
