"""The exact KL for any verl policy loss: the `rpg_kl_<div>` rows of the loss table (docs/losses.md#kl-addon).

Per micro-batch, with verl 0.9.1's `PolicyLossFn` signature,

    L = base(old_log_prob, log_prob, A, mask, loss_agg_mode, config, rollout_is_weights)   (verl's registered loss)
      + agg_loss(β·K·v, mask, addon_kl_agg_mode(loss_agg_mode), **global_batch_info)

where the base is `policy_loss.base_loss_mode` looked up in verl's registry and called exactly as verl's `ppo_loss`
calls a policy loss, `v` the rollout-correction weights and K the per-token KL term (`kl_term`):

    kl_credit=token:     K_t = D̂(w_t, ρ_t)                                   (Tables 1/4, ρ-weighted)
    kl_credit=sequence:  K_t = SG(P_t)·D̂(w_t, ρ_t) + SG(G_t)·(log w_t − SG(log w_t))    (reverse rows)
                         K_t = SG(R_t)·D̂(w_t, ρ_t)                                     (forward rows)

with the TOKEN ratio w_t = π_θ/π_old of each token whatever ratio the base uses, ρ = π_ref/π_old (1 for the
iterative reference) and the prefix ratios / future credit of `rpg.kl_credit`. No clamp, no clip: the additive
placement, so over `vanilla` it is `rpg_<div>` wherever |log w| ≤ 20 (verl's clamp). Masked tokens (padding,
observation spans) carry no KL (docs/losses.md#multi-turn). The KL term is aggregated with the base's mode, except
that seq-mean-token-mean (1/|y| per response: not the gradient of any KL) becomes seq-mean-token-sum-norm with the
fixed `loss_scale_factor`, a constant denominator (`aggregate_kl`, `rpg.kl_aggregation`,
docs/losses.md#kl-aggregation).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

from rpg.divergences import LOG_RATIO_GUARD, Divergence, guarded_log_ratio
from rpg.kl_aggregation import addon_kl_agg_mode
from rpg.kl_credit import SequenceCredit, sequence_credit
from rpg.loss_table import LossSpec
from rpg.losses import LossTerm, policy_loss_fn, reference_ratio
from rpg.topk_kl import share_ratio
from rpg.topk_loss import topk_loss, topk_metrics

Tensor = torch.Tensor

__all__ = ["KLTerm", "aggregate_kl", "kl_log_ratio", "kl_term", "make_addon_loss", "ratios", "sampled_estimate",
           "sampled_share"]


def kl_log_ratio(log_prob: Tensor, old_log_prob: Tensor, mask: Tensor) -> Tensor:
    """log w_t = log π_θ(y_t|h_t) − log π_old(y_t|h_t) per token, with its gradient (0 on masked tokens, within the
    guard). The one place the add-on's ratio is formed: the tests replace it by a sequence ratio or drop it and show
    that the gradient checks then fail."""
    return guarded_log_ratio(log_prob, old_log_prob.detach(), mask)


class KLTerm(NamedTuple):
    """The per-token KL term (β included, before the rollout weights) and the detached quantities of the metrics."""

    loss: Optional[Tensor]  # (bs, T), exactly 0 on masked tokens; None: no sampled term (`ratios`)
    mask: Tensor  # bool (bs, T): model tokens
    log_w: Tensor  # detached
    w: Tensor  # detached
    log_rho: Tensor | float
    rho: Tensor | float
    credit: Optional[SequenceCredit]  # None for kl_credit=token


def kl_term(
    log_prob: Tensor,
    old_log_prob: Tensor,
    response_mask: Tensor,
    div: Divergence,
    beta: float,
    ref_log_prob: Optional[Tensor] = None,
    kl_credit: str = "token",
) -> KLTerm:
    """β·K per token (module docstring; docs/losses.md#kl-addon, #kl-credit). Shapes (bs, T)."""
    mask = response_mask.bool()
    log_w = kl_log_ratio(log_prob, old_log_prob, mask)
    w = torch.exp(log_w)
    log_rho, rho = reference_ratio(old_log_prob, ref_log_prob, mask)
    surrogate = div.surrogate(log_w, w, log_rho, rho)
    credit = None
    if kl_credit == "token":
        loss = surrogate * beta
    elif kl_credit == "sequence":
        credit = sequence_credit(div, log_w.detach(), log_rho, mask, beta)
        loss = surrogate * (credit.history * beta)
        if credit.future is not None:  # value 0, gradient β·G_t·∇log π_θ(y_t|h_t)
            loss = loss + credit.future * (log_w - log_w.detach())
    else:
        raise ValueError(f"kl_credit={kl_credit!r}; choose 'token' or 'sequence'")
    loss = torch.where(mask, loss, 0.0)
    return KLTerm(loss, mask, log_w.detach(), w.detach(), log_rho, rho, credit)


def ratios(log_prob: Tensor, old_log_prob: Tensor, response_mask: Tensor,
           ref_log_prob: Optional[Tensor] = None) -> KLTerm:
    """The detached ratios of the metrics without a sampled KL term (`loss` None): the top-k path, whose KL is the
    top-k KL (docs/losses.md#topk-kl). Shapes (bs, T)."""
    mask = response_mask.bool()
    with torch.no_grad():
        log_w = kl_log_ratio(log_prob.detach(), old_log_prob, mask)
    log_rho, rho = reference_ratio(old_log_prob, ref_log_prob, mask)
    return KLTerm(None, mask, log_w, torch.exp(log_w), log_rho, rho, None)


def sampled_estimate(term: KLTerm, div: Divergence) -> Tensor:
    """The per-token estimate of D(π_θ, π_ref) from the sampled token (`Divergence.estimate`, ≥ 0), detached, 0 on
    masked tokens, (bs, T): `actor/rpg/kl`, and the KL the add-on regularises with kl_estimator=sampled."""
    with torch.no_grad():
        return torch.where(term.mask, div.estimate(term.log_w, term.w, term.log_rho, term.rho), 0.0)


def aggregate_kl(loss_mat: Tensor, mask: Tensor, loss_agg_mode: str, batch_info: dict) -> Tensor:
    """The add-on's KL term aggregated with verl's `agg_loss` in `addon_kl_agg_mode(loss_agg_mode)`: the base's mode,
    or a constant denominator over a seq-mean-token-mean base (docs/losses.md#kl-aggregation)."""
    from verl.trainer.ppo.core_algos import agg_loss

    return agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=addon_kl_agg_mode(loss_agg_mode), **batch_info)


def sampled_share(
    term: KLTerm, div: Divergence, beta: float, advantages: Tensor, log_prob: Tensor, old_log_prob: Tensor
) -> tuple[Tensor, Tensor]:
    """The KL share's per-token norms for the sampled KL (docs/losses.md#sampled-share). The term's logit-space
    gradient is c_t·(e_y − p) with c_t = ∂K_t/∂log π_θ(y_t|h_t) = −β·C_KL(w_t, ρ_t) (token credit; sequence credit:
    −β·P_t·C_KL + β·G_t, or −β·R_t·C_KL), 0 beyond the ±60 guard; the reward term's is A_t·(e_y − p). Same direction:
    per token the share is |c_t|/(|c_t| + |A_t|) exactly. Summed over tokens, each is weighted by n_t = 1 − p_y, the
    sampled token's part of ‖e_y − p‖ (‖e_y − p‖/n_t ∈ [1, √2]; the full norm needs Σ_V p², which only the top-k
    pass computes). Returns (|c_t|·n_t, |A_t|·n_t), float64, 0 on masked tokens. Shapes (bs, T)."""
    with torch.no_grad():
        f64 = torch.float64
        c = -beta * div.kl_component(term.log_w, term.w, term.log_rho, term.rho).to(f64)
        if term.credit is not None:
            c = c * term.credit.history.to(f64)
            if term.credit.future is not None:
                c = c + term.credit.future.to(f64)
        live = term.mask & ((log_prob.detach() - old_log_prob.detach()).abs() <= LOG_RATIO_GUARD)  # the guard's clamp
        n = (-torch.expm1(log_prob.detach().to(f64))).clamp(min=0.0)  # 1 − p_y
        return (torch.where(live, c.abs() * n, 0.0),
                torch.where(term.mask, advantages.detach().to(f64).abs() * n, 0.0))


def _metrics(term: KLTerm, estimate: Tensor, kl_loss: Tensor,
             share: Optional[tuple[Tensor, Tensor]] = None) -> dict[str, float]:
    """actor/rpg/{kl, kl_loss, ratio_mean, ratio_max, ratio_min[, kl_credit_abs][, kl_share]} over the model tokens,
    with one device→host transfer; {} for a micro-batch without model tokens. `estimate`: `sampled_estimate`;
    `share`: `sampled_share`'s norms. Measures only (the KL the adaptive β reads is handed over by
    `rpg.losses.policy_loss_fn`)."""
    with torch.no_grad():
        mask, w = term.mask, term.w
        valid = mask.to(w.dtype)
        credit = term.credit.future if term.credit is not None and term.credit.future is not None else None
        zero = valid.new_zeros(())
        shares = (x.sum(dtype=torch.float64) for x in share) if share is not None else (zero, zero)
        parts = (
            valid.sum(),
            estimate.sum(),
            (w * valid).sum(),
            torch.where(mask, w, 0.0).amax(),
            torch.where(mask, w, torch.finfo(w.dtype).max).amin(),
            kl_loss.detach().to(w.dtype),
            (credit.abs() * valid).sum() if credit is not None else zero,
            *shares,
        )
        stats = torch.stack([x.double() for x in parts]).tolist()
    n = stats[0]
    if n == 0:
        return {}
    out = {
        "actor/rpg/kl": stats[1] / n,
        "actor/rpg/ratio_mean": stats[2] / n,
        "actor/rpg/ratio_max": stats[3],
        "actor/rpg/ratio_min": stats[4],
        "actor/rpg/kl_loss": stats[5],
    }
    if credit is not None:
        out["actor/rpg/kl_credit_abs"] = stats[6] / n
    if share is not None:
        out["actor/rpg/kl_share"] = share_ratio(stats[7], stats[8])
    return out


def make_addon_loss(spec: LossSpec):
    """The verl `PolicyLossFn` of an add-on row (`rpg_kl_<div>`): the base loss of `policy_loss.base_loss_mode` plus
    the exact KL term of `spec.divergence` (module docstring), through `rpg.losses.policy_loss_fn`."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    div = spec.divergence

    def term(settings: Any, config: Any, inputs: tuple, ref: Optional[torch.Tensor], beta: float) -> LossTerm:
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, rollout_is_weights = inputs
        base_loss, metrics = get_policy_loss_fn(settings.base_loss_mode)(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
        )
        if settings.topk:  # the top-k KL is the term (docs/losses.md#topk-kl): no sampled one is built
            topk = topk_loss(settings, div, log_prob, old_log_prob, ref, response_mask, beta, advantages)
            kl = ratios(log_prob, old_log_prob, response_mask, ref)._replace(loss=topk.loss)
            estimate = sampled_estimate(kl, div)  # measured only: actor/rpg/kl beside actor/rpg/topk_kl
            regularised, share, extra = topk.kl, None, topk_metrics(topk, kl.mask)
        else:
            kl = kl_term(log_prob, old_log_prob, response_mask, div, beta, ref, settings.kl_credit)
            estimate = sampled_estimate(kl, div)
            regularised, share, extra = estimate, sampled_share(kl, div, beta, advantages, log_prob, old_log_prob), {}

        def finish(kl_loss: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            return base_loss + kl_loss, {**(metrics or {}), **_metrics(kl, estimate, kl_loss, share), **extra}

        return LossTerm(kl.loss, kl.mask, regularised, finish)

    return policy_loss_fn(spec, "policy_loss.base_loss_mode, kl_coef", term, aggregate=aggregate_kl)
