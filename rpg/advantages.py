"""Advantage estimators of RPG: a baseline subtracted from the sequence score, no std normalisation.

The paper uses `A = R − b` with a baseline `b` that does not depend on the sampled item (App. G.1/G.2; the gradient
stays unbiased because `E_old[w·b·∇log π_θ] = b·∇∫π_θ = 0`, docs/losses.md#exact-gradients). The authors' scripts use
the per-prompt group mean (`rpg`); Algorithms 1/2 give the batch mean as the example (`rpg_batchmean`).

Both receive verl's `token_level_rewards` (bs, T) whose row sum is the sequence score `s_i` (the rule reward sits
on the last valid token), and return `(advantages, returns)`, both `A_i` broadcast over the response and zero on
padding. Registered with verl's `register_adv_est` (by `rpg.verl_plugin`, which is why verl is imported only inside
`compute_rpg_outcome_advantage`); select with `algorithm.adv_estimator=rpg|rpg_batchmean`.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

Tensor = torch.Tensor


def compute_rpg_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Optional[Any] = None,
    index: Optional[np.ndarray] = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """`rpg`: A_i = s_i − mean_{j ∈ group(i)} s_j (group = responses of the same prompt, verl's `uid`).

    A singleton group uses mean 0 (A_i = s_i), as the authors' code does. Shapes: (bs, T) → (bs, T), (bs, T).
    """
    if index is None:
        raise ValueError("adv_estimator=rpg needs the prompt group index (`uid`) that verl's trainer passes as `index`")
    from verl.utils import as_torch_index, group_mean_std  # here: rpg.verl_plugin imports this module light

    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        group = as_torch_index(index, device=scores.device)
        mean_g, _, _ = group_mean_std(scores, group, eps=0.0, device=scores.device)
        adv = (scores - mean_g[group].to(scores.dtype)).unsqueeze(-1) * response_mask
    return adv, adv


def compute_rpg_batchmean_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Optional[Any] = None,
    index: Optional[np.ndarray] = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """`rpg_batchmean`: A_i = s_i − mean_j s_j over the whole batch (Algorithms 1/2, line 6 example)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        adv = (scores - scores.mean()).unsqueeze(-1) * response_mask
    return adv, adv


ADVANTAGE_ESTIMATORS = {
    "rpg": compute_rpg_outcome_advantage,
    "rpg_batchmean": compute_rpg_batchmean_outcome_advantage,
}
