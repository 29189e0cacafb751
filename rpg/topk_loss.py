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

from rpg.divergences import Divergence, guarded_log_ratio
from rpg.topk_kl import sampled_tail, sequence_credited

Tensor = torch.Tensor

__all__ = ["TopKLoss", "direction", "topk_loss", "topk_metrics"]


class TopKLoss(NamedTuple):
    loss: Tensor  # (bs, T) β·K per token (credited), 0 on masked tokens
    kl: Tensor  # (bs, T) detached K (analytic + tail), 0 on masked tokens


def direction(div: Divergence) -> str:
    """The top-k KL's direction of a divergence row: reverse for rkl/urkl, forward for fkl/ufkl."""
    return "reverse" if div.reverse else "forward"


def topk_loss(settings: Any, div: Divergence, log_prob: Tensor, old_log_prob: Tensor, ref_log_prob: Optional[Tensor],
              response_mask: Tensor, beta: float) -> TopKLoss:  # fmt: skip
    """β·K per token of the current micro-batch (module docstring). Shapes (bs, T)."""
    from rpg.topk_hook import current

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
    if settings.kl_topk_tail == "sampled":
        kl = kl + sampled_tail(log_prob, old_log_prob, ref_log_prob, terms.in_support, mask, way)
    if settings.kl_credit == "sequence":
        log_w = guarded_log_ratio(log_prob, old_log_prob.detach(), mask)
        log_rho = 0.0 if ref_log_prob is None else guarded_log_ratio(ref_log_prob.detach(), old_log_prob.detach(), mask)
        loss = sequence_credited(kl, log_w, log_rho, mask, beta, way)
    else:
        loss = torch.where(mask, kl * beta, 0.0)
    return TopKLoss(loss, kl.detach())


def topk_metrics(term: TopKLoss, mask: Tensor) -> dict[str, float]:
    """actor/rpg/topk_kl: the mean per-token top-k KL (analytic + tail) over the model tokens (one transfer)."""
    with torch.no_grad():
        m = mask.bool()
        n, total = torch.stack([m.sum(dtype=torch.float64), torch.where(m, term.kl, 0.0).sum(dtype=torch.float64)]
                               ).tolist()  # fmt: skip
    return {"actor/rpg/topk_kl": total / n} if n > 0 else {}
