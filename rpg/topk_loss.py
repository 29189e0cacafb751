"""The top-k KL as the KL term of the RPG losses and the add-on (`policy_loss.kl_estimator=topk`,
docs/losses.md#topk-kl).

Per token, with K_t = the analytic part at the support (+ the bucket tail), from the engine hook (`rpg.topk_hook`),
plus the sampled tail 1[y∉S]·w·log(p_y/q_y) (reverse) or 1[y∉S]·ρ·log(q_y/p_y) (forward) when `kl_topk_tail=sampled`:

    kl_credit=token:     β·K_t, outside the clip, the analytic part not multiplied by w
    kl_credit=sequence:  `rpg.topk_kl.sequence_credited` (prefix ratios; the detached K replaces the sampled KL in
                         the future credit)

It replaces the sampled regulariser: the losses run their reward part with β = 0 (RPG-REINFORCE then branches on A,
`branch_on=advantage`, enforced by `rpg.loss_config.topk_errors`) and add this term. torch only; the terms come from
`rpg.topk_hook.current` (no verl import here).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

from rpg import modes
from rpg.divergences import Divergence, guarded_log_ratio
from rpg.topk_hook import current
from rpg.topk_kl import KLShare, kl_share_from_moments, sampled_tail, sequence_credited, share_ratio

Tensor = torch.Tensor

__all__ = ["TopKLoss", "direction", "topk_loss", "topk_metrics"]


class TopKLoss(NamedTuple):
    loss: Tensor  # (bs, T) β·K per token (credited), 0 on masked tokens
    kl: Tensor  # (bs, T) detached K (analytic + tail), 0 on masked tokens
    share: Optional[KLShare] = None  # per token β·‖∇_z K‖ and |A|·‖e_y − p‖ (None: the engine gave no moments)


def direction(div: Divergence) -> str:
    """The top-k KL's direction of a divergence row: reverse for rkl/urkl, forward for fkl/ufkl."""
    return "reverse" if div.reverse else "forward"


def topk_loss(settings: Any, div: Divergence, log_prob: Tensor, old_log_prob: Tensor, ref_log_prob: Optional[Tensor],
              response_mask: Tensor, beta: float, advantages: Tensor) -> TopKLoss:
    """β·K per token of the current micro-batch (module docstring), and the KL share's per-token norms
    (`rpg.topk_kl.kl_share`, closed form, no second backward). Shapes (bs, T)."""
    terms = current()
    if terms is None:
        raise RuntimeError(
            f"loss_mode={settings.loss_mode!r} with kl_estimator='topk' found no top-k KL for this micro-batch: "
            "rpg's engine hook computes it in verl's update (rpg/topk_hook.py), installed at `import verl` when "
            "RPG_INSTALL names topk_kl (the launcher sets it; rpg/install.py). Called outside verl's ppo_loss?"
        )
    mask = response_mask.bool()
    way = direction(div)
    if terms.kl.shape != log_prob.shape:
        raise RuntimeError(f"top-k KL of shape {tuple(terms.kl.shape)} for log-probs of shape {tuple(log_prob.shape)}")
    kl = torch.where(mask, terms.kl.to(log_prob.dtype), 0.0)
    if modes.topk_tail(settings.kl_topk_tail).in_loss:
        kl = kl + sampled_tail(log_prob, old_log_prob, ref_log_prob, terms.in_support, mask, way)
    if settings.kl_credit == "sequence":
        log_w = guarded_log_ratio(log_prob, old_log_prob.detach(), mask)
        log_rho = 0.0 if ref_log_prob is None else guarded_log_ratio(ref_log_prob.detach(), old_log_prob.detach(), mask)
        loss = sequence_credited(kl, log_w, log_rho, mask, beta, way)
    else:
        loss = torch.where(mask, kl * beta, 0.0)
    share = None
    if terms.moments is not None:
        share = kl_share_from_moments(terms.moments, way, settings.kl_topk_tail, beta, advantages, log_prob.detach(),
                                      terms.in_support, mask, old_log_prob, ref_log_prob)
    return TopKLoss(loss, kl.detach(), share)


def topk_metrics(term: TopKLoss, mask: Tensor) -> dict[str, float]:
    """Over the model tokens, with one transfer: actor/rpg/topk_kl, the mean per-token top-k KL (analytic + tail);
    actor/rpg/kl_share, Σ β·‖∇_z K‖ / (Σ β·‖∇_z K‖ + Σ |A|·‖e_y − p‖) in [0, 1] (the KL term's logit-space gradient
    against the reward term's, per token, summed; 1 where every advantage is 0, 0 where both vanish; beside
    actor/rpg/kl_adv_rel, which is 0 here: no KL in the advantage)."""
    with torch.no_grad():
        m = mask.bool()
        f64 = torch.float64
        zero = torch.zeros((), dtype=f64, device=m.device)
        kl_norm, adv_norm = (x.sum(dtype=f64) for x in term.share) if term.share is not None else (zero, zero)
        n, total, kl_sum, adv_sum = torch.stack([m.sum(dtype=f64), torch.where(m, term.kl, 0.0).sum(dtype=f64),
                                                 kl_norm, adv_norm]).tolist()
    if n == 0:
        return {}
    out = {"actor/rpg/topk_kl": total / n}
    if term.share is not None:
        out["actor/rpg/kl_share"] = share_ratio(kl_sum, adv_sum)
    return out
