"""The `rpg` and `rpg_batchmean` advantage estimators, through verl's registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn


def _rewards(scores, T=4, lengths=None):
    bs = len(scores)
    lengths = lengths or [T] * bs
    r = torch.zeros(bs, T)
    mask = torch.zeros(bs, T)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        r[i, n - 1] = s  # the rule reward sits on the last valid token
        mask[i, :n] = 1
    return r, mask


def test_rpg_is_score_minus_group_mean_without_std():
    scores = [1.0, -1.0, 1.0, 0.5, -2.0, 3.0]
    index = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    r, mask = _rewards(scores, lengths=[4, 2, 3, 1, 4, 2])
    adv, ret = get_adv_estimator_fn("rpg")(token_level_rewards=r, response_mask=mask, config=None, index=index)
    mean_a, mean_b = (1 - 1 + 1) / 3, (0.5 - 2) / 2
    expected = torch.tensor([1 - mean_a, -1 - mean_a, 1 - mean_a, 0.5 - mean_b, -2 - mean_b, 3.0])  # singleton: mean 0
    assert torch.allclose(adv, expected.unsqueeze(1) * mask, atol=1e-6)
    assert torch.equal(adv, ret)
    assert (adv[mask == 0] == 0).all()


def test_rpg_batchmean_is_score_minus_batch_mean():
    scores = [1.0, -1.0, 2.0, 0.0]
    r, mask = _rewards(scores, lengths=[4, 1, 2, 3])
    adv, _ = get_adv_estimator_fn("rpg_batchmean")(token_level_rewards=r, response_mask=mask)
    assert torch.allclose(adv, (torch.tensor(scores) - 0.5).unsqueeze(1) * mask)


def test_rpg_differs_from_grpo_only_by_std_normalisation():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(12, generator=g).tolist()
    index = np.repeat(np.array(["p0", "p1", "p2"], dtype=object), 4)
    r, mask = _rewards(scores)
    ours, _ = get_adv_estimator_fn("rpg")(token_level_rewards=r, response_mask=mask, index=index)
    grpo, _ = get_adv_estimator_fn("grpo")(token_level_rewards=r, response_mask=mask, index=index,
                                           norm_adv_by_std_in_grpo=False)  # fmt: skip
    assert torch.allclose(ours, grpo, atol=1e-6)


def test_rpg_without_group_index_is_a_clear_error():
    r, mask = _rewards([1.0, 2.0])
    with pytest.raises(ValueError, match="uid"):
        get_adv_estimator_fn("rpg")(token_level_rewards=r, response_mask=mask, index=None)
