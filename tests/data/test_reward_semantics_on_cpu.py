"""verl 0.9.1's reward machinery vs the reference reward semantics (docs/differences.md#s7-4, #s7-6).

What is checked, and against what:
* the score: +1/-1 with a boolean ``acc`` and the normalised ``pred`` (verl's math_dapo scorer);
* routing per ``data_source``: which names verl's ``default_compute_score`` scores, which it rejects
  (``amc_23``, ``minerva-math``, ``olympiadbench``, ``math-dapo``), and that ``rpg.data.reward`` routes
  them as the reference does (math_dapo for ``amc*``, Math-Verify +-1 for Minerva/OlympiadBench);
* the one semantic difference inside verl's math_dapo scorer (``\\boxed{}`` fallback) and that
  ``rpg.data.reward`` restores the reference behaviour;
* verl's real ``dapo`` reward manager, loaded through verl's own ``load_reward_manager`` with
  ``rpg.data.reward.compute_score`` as custom score: overlong penalty
  ``min(-(L - (Lmax - B)) / B * factor, 0)`` added to the score, reward placed on token ``L - 1``;
* verl's validation metric over k-times repeated rows equals the per-problem mean@k average.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.utils.reward_score import default_compute_score

from rpg.data import reward as rpg_reward

RIGHT = "Let me think.\nThe sum is 42.\nAnswer: 42"
WRONG = "Let me think.\nAnswer: 41"


# ---------------------------------------------------------------------------------------- scores


@pytest.mark.parametrize("data_source", ["math_dapo", "aime2025", "aime_2024"])
def test_verl_routes_math_dapo_sources_with_reference_score(data_source):
    good = default_compute_score(data_source, RIGHT, "42")
    bad = default_compute_score(data_source, WRONG, "42")
    assert good == {"score": 1.0, "acc": True, "pred": "42"}
    assert bad == {"score": -1.0, "acc": False, "pred": "41"}
    assert type(good["acc"]) is bool


@pytest.mark.parametrize("data_source", ["amc_23", "minerva-math", "olympiadbench", "math-dapo"])
def test_verl_default_cannot_score_these_sources(data_source):
    """The gap rpg.data.reward fills (docs/differences.md#d17 for the hyphenated name)."""
    with pytest.raises(NotImplementedError, match=data_source):
        default_compute_score(data_source, RIGHT, "42")


@pytest.mark.parametrize("data_source", ["math_dapo", "aime2025", "amc_23", "amc"])
def test_rpg_reward_routes_math_dapo_family(data_source):
    assert rpg_reward.compute_score(data_source, RIGHT, "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert rpg_reward.compute_score(data_source, WRONG, "42") == {"score": -1.0, "acc": False, "pred": "41"}


@pytest.mark.parametrize(
    ("response", "truth", "expected_acc"),
    [
        ("answer: 1,000 dollars", "1000", True),  # case-insensitive, unit and thousands comma removed
        ("x = 3\nAnswer: $\\frac{1}{2}$", "\\frac{1}{2}", True),
        ("Answer: 5\nAnswer: 6", "5", False),  # the last Answer line wins
        ("Answer: 7." , "7", False),  # no trailing-dot stripping
        ("I give up", "7", False),  # no Answer line -> "[INVALID]"
        ("Answer: 7\n" + "z" * 300, "7", False),  # only the last 300 characters are searched
    ],
)
def test_math_dapo_normalisation_same_in_verl_and_rpg(response, truth, expected_acc):
    ours = rpg_reward.compute_score("math_dapo", response, truth)
    verls = default_compute_score("math_dapo", response, truth)
    assert ours["acc"] is expected_acc and ours["score"] == (1.0 if expected_acc else -1.0)
    assert verls == ours


def test_boxed_only_response_is_the_one_divergence():
    """verl 0.9.1 falls back to the last \\boxed{} when there is no Answer line; the reference does not
    (docs/differences.md#s7-4). rpg.data.reward keeps the reference behaviour."""
    response = "so the result is \\boxed{42}"
    assert default_compute_score("math_dapo", response, "42")["acc"] is True
    assert rpg_reward.compute_score("math_dapo", response, "42") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    # after an Answer: line the box is unwrapped by the normaliser in both
    assert rpg_reward.compute_score("math_dapo", "Answer: \\boxed{42}", "42")["acc"] is True


def test_math_verify_sources_score_plus_minus_one():
    """Minerva/OlympiadBench: Math-Verify verdict as +-1 and boolean acc, same keys as math_dapo (a batch
    mixing sources needs identical reward_extra_info keys)."""
    pytest.importorskip("math_verify")
    right = rpg_reward.compute_score("minerva-math", "Thus the answer is $\\boxed{\\frac{1}{2}}$.", "0.5")
    wrong = rpg_reward.compute_score("olympiadbench", "Thus the answer is $\\boxed{3}$.", "\\sqrt{2}")
    assert right == {"score": 1.0, "acc": True, "pred": "\\frac{1}{2}"}
    assert wrong == {"score": -1.0, "acc": False, "pred": "3"}
    assert set(right) == set(rpg_reward.compute_score("math_dapo", RIGHT, "42"))


def test_unknown_sources_delegate_to_verl():
    assert rpg_reward.compute_score("openai/gsm8k", "#### 42", "42") == default_compute_score(
        "openai/gsm8k", "#### 42", "42"
    )
    with pytest.raises(NotImplementedError, match="math-dapo"):
        rpg_reward.compute_score("math-dapo", RIGHT, "42")


# ----------------------------------------------------------------------- verl's DAPO reward manager

MAX_RESP = 16
BUFFER = 4
FACTOR = 0.5


def reference_overlong_penalty(length: int) -> float:
    """The DAPO overlong penalty (docs/differences.md#s7-4), written independently of verl."""
    return min(-(length - (MAX_RESP - BUFFER)) / BUFFER * FACTOR, 0.0)


@pytest.fixture(scope="module")
def dapo_manager(tiny_tokenizer):
    from verl.trainer.ppo.reward import load_reward_manager

    config = OmegaConf.create(
        {
            "reward": {
                "reward_manager": {"source": "register", "name": "dapo"},
                "custom_reward_function": {"path": "pkg://rpg.data.reward", "name": "compute_score"},
                "reward_kwargs": {
                    "max_resp_len": MAX_RESP,
                    "overlong_buffer_cfg": {"enable": True, "len": BUFFER, "penalty_factor": FACTOR, "log": True},
                },
            }
        }
    )
    manager = load_reward_manager(config, tiny_tokenizer)
    assert type(manager).__name__ == "DAPORewardManager"
    return manager


def make_batch(tokenizer, texts: list[str], data_source: str, truth: str, prompt_len: int = 3):
    """DataProto like the rollout's: left-padded prompts, right-padded responses ending in EOS."""
    from verl import DataProto

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    responses, masks = [], []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False) + [eos]
        assert len(ids) <= MAX_RESP, text
        responses.append(ids + [pad] * (MAX_RESP - len(ids)))
        masks.append([1] * prompt_len + [1] * len(ids) + [0] * (MAX_RESP - len(ids)))
    n = len(texts)
    batch = {
        "prompts": torch.full((n, prompt_len), 65),
        "responses": torch.tensor(responses),
        "attention_mask": torch.tensor(masks),
    }
    non_tensor = {
        "data_source": np.array([data_source] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": truth, "style": "rule"}] * n, dtype=object),
        "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
    }
    return DataProto.from_dict(tensors=batch, non_tensors=non_tensor)


def run_manager(manager, data):
    return [manager.loop.run_until_complete(manager.run_single(data[i : i + 1])) for i in range(len(data))]


@pytest.mark.parametrize("data_source", ["math_dapo", "amc_23"])
def test_dapo_manager_overlong_penalty_and_placement(dapo_manager, tiny_tokenizer, data_source):
    # response lengths L (incl. EOS) = 10, 12, 13, 14, 16: no penalty up to Lmax - B = 12, then linear
    texts = ["Answer: 7", "a\nAnswer: 7", "ab\nAnswer: 7", "abc\nAnswer: 8", "abcde\nAnswer: 7"]
    lengths = [len(t.encode()) + 1 for t in texts]
    assert lengths == [10, 12, 13, 14, 16]
    data = make_batch(tiny_tokenizer, texts, data_source, "7")
    outs = run_manager(dapo_manager, data)

    scores = [1.0, 1.0, 1.0, -1.0, 1.0]
    for out, length, score in zip(outs, lengths, scores, strict=True):
        info = out["reward_extra_info"]
        assert info["score"] == score and info["acc"] is (score > 0)
        # verl computes L as a 0-d tensor, so the penalty fields may be tensors: compare as floats
        assert float(info["overlong_reward"]) == pytest.approx(reference_overlong_penalty(length))
        assert bool(info["overlong"]) is (length > MAX_RESP - BUFFER)
        assert float(out["reward_score"]) == pytest.approx(score + reference_overlong_penalty(length))
    assert float(outs[-1]["reward_score"]) == pytest.approx(1.0 - FACTOR)  # L = Lmax: penalty = -factor

    rm_scores = type(dapo_manager).assemble_rm_scores(data, [float(o["reward_score"]) for o in outs])
    for row, (out, length) in enumerate(zip(outs, lengths, strict=True)):
        expected = torch.zeros(MAX_RESP)
        expected[length - 1] = float(out["reward_score"])  # last valid token (the EOS)
        torch.testing.assert_close(rm_scores[row], expected)


def test_dapo_manager_decodes_without_special_tokens(dapo_manager, tiny_tokenizer):
    """The EOS is stripped before scoring: 'Answer: 7<|im_end|>' must score as '7'."""
    out = run_manager(dapo_manager, make_batch(tiny_tokenizer, ["Answer: 7"], "aime2025", "7"))[0]
    assert out["reward_extra_info"]["pred"] == "7" and out["reward_extra_info"]["acc"] is True


# ----------------------------------------------------------------------------- validation metric


def test_validation_mean_over_repeated_rows_is_mean_at_k():
    """verl 0.9.1 gives every validation row its own uid, so a k-times repeated file yields
    ``acc/mean@1`` -- numerically the paper's mean@k (docs/differences.md#s7-6): average over problems of the mean
    over their k samples."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    k = 4
    acc_by_problem = {"p0": [True, False, False, False], "p1": [True, True, True, False], "p2": [False] * 4}
    sources, uids, acc = [], [], []
    for problem, values in acc_by_problem.items():
        for r, a in enumerate(values):
            sources.append("aime2025")
            uids.append(f"{problem}-{r}")  # one uid per row, as _validate does
            acc.append(a)
    metrics = process_validation_metrics(sources, uids, {"acc": acc})["aime2025"]["acc"]
    expected = np.mean([np.mean(v) for v in acc_by_problem.values()])  # (1/4 + 3/4 + 0) / 3
    assert metrics["mean@1"] == pytest.approx(expected) == pytest.approx(1 / 3)
    assert f"mean@{k}" not in metrics

    grouped = process_validation_metrics(sources, [u.split("-")[0] for u in uids], {"acc": acc})
    assert grouped["aime2025"]["acc"][f"mean@{k}"] == pytest.approx(expected)  # val_kwargs.n=k layout
