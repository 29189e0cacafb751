"""What verl's trainer can hand `rpg.data.reward.compute_score`, and what it does with it.

verl 0.9.1 reads each parquet row with Hugging Face `datasets` (`RLHFDataset.__getitem__`: Python values as the
column type gives them), collates them into numpy object arrays (`collate_fn`), and the reward manager passes
`non_tensor_batch["data_source"]` and `non_tensor_batch["reward_model"]["ground_truth"]` unchanged to the score
function. So a ground truth can be a str, an int, a float, a bool, a list or None, and the data source None, depending
only on the parquet's column types. Decided here:

* int, float with an integral value, one-element list (or numpy array) of those, numpy scalars: scored as the answer
  text (`5`, `5.0`, `[5]` and `"5"` all match `Answer: 5`);
* bool, None, NaN/inf, lists of another length, anything else: `ValueError` naming the value (and `rpg.launch`
  refuses such rows before launch: tests/recipes/test_launch_inputs_on_cpu.py);
* a `data_source` that is not a string: `ValueError` (refused at launch as well).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from rpg.data import reward as rpg_reward

RIGHT = "Let me think.\nAnswer: 5"


@pytest.mark.parametrize(
    "truth",
    [5, 5.0, [5], ["5"], (5,), np.int64(5), np.float32(5.0), np.array(["5"]), np.array([5]), np.str_("5")],
    ids=lambda t: f"{type(t).__name__}:{t!r}",
)
def test_non_string_ground_truths_score_as_their_text(truth):
    assert rpg_reward.compute_score("math_dapo", RIGHT, truth) == {"score": 1.0, "acc": True, "pred": "5"}
    assert rpg_reward.compute_score("aime2025", "Answer: 6", truth)["acc"] is False


@pytest.mark.parametrize("truth, text", [(0.5, "0.5"), (-3, "-3"), (1e-5, "1e-05"), (12.25, "12.25")])
def test_non_integral_floats_keep_their_shortest_text(truth, text):
    assert rpg_reward.ground_truth_text(truth) == text
    assert rpg_reward.compute_score("math_dapo", f"Answer: {text}", truth)["acc"] is True


@pytest.mark.parametrize(
    "truth, needle",
    [
        (True, "bool"),
        (None, "None"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        ([1, 2], "2 elements"),
        ([], "0 elements"),
        ({"answer": "5"}, "dict"),
        ([[5]], "list"),
    ],
    ids=repr,
)
def test_unscorable_ground_truths_raise_naming_the_value(truth, needle):
    with pytest.raises(ValueError, match="ground truth") as info:
        rpg_reward.compute_score("math_dapo", RIGHT, truth)
    assert needle in str(info.value)


@pytest.mark.parametrize("data_source", [None, 5, np.nan])
def test_non_string_data_source_raises_clearly(data_source):
    with pytest.raises(ValueError, match=r"data_source=.* is not a string"):
        rpg_reward.compute_score(data_source, RIGHT, "5")


def test_math_verify_sources_take_numbers_too():
    pytest.importorskip("math_verify")
    assert rpg_reward.compute_score("minerva-math", "so $\\boxed{5}$.", 5)["acc"] is True


def test_delegated_sources_get_the_ground_truth_unchanged(monkeypatch):
    """Sources verl scores (e.g. gsm8k) keep verl's own contract: the value is passed through untouched."""
    seen = []
    import verl.utils.reward_score as verl_scores

    monkeypatch.setattr(verl_scores, "default_compute_score", lambda *a, **k: seen.append(a[2]) or 0.0)
    rpg_reward.compute_score("openai/gsm8k", "#### 5", [5, 6])
    assert seen == [[5, 6]]


# ------------------------------------------------ the values verl really hands over, through its own reader


def _write(path, data_source, ground_truths, gt_type):
    n = len(ground_truths)
    table = pa.table(
        {
            "data_source": pa.array([data_source] * n, pa.string()),
            "prompt": pa.array([[{"role": "user", "content": "1+4?"}]] * n),
            "reward_model": pa.array(
                [{"style": "rule", "ground_truth": g} for g in ground_truths],
                pa.struct([("style", pa.string()), ("ground_truth", gt_type)]),
            ),
        }
    )
    pq.write_table(table, path)
    return str(path)


@pytest.mark.parametrize(
    "gt_type, truth",
    [(pa.int64(), 5), (pa.float64(), 5.0), (pa.list_(pa.string()), ["5"]), (pa.list_(pa.int64()), [5])],
    ids=["int64", "float64", "list<string>", "list<int64>"],
)
def test_verl_dataset_rows_are_scored_by_the_dapo_manager(tmp_path, tiny_tokenizer, gt_type, truth):
    """A parquet with a non-string ground-truth column, read by verl's RLHFDataset and collate_fn, scored by verl's
    dapo reward manager with rpg's compute_score: 'Answer: 5' scores +1."""
    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    path = _write(tmp_path / "t.parquet", "math_dapo", [truth], gt_type)
    dataset = RLHFDataset([path], tiny_tokenizer, OmegaConf.create({"filter_overlong_prompts": False}))
    batch = collate_fn([dataset[0]])
    handed = batch["reward_model"][0]["ground_truth"]
    assert not isinstance(handed, str)  # verl really hands over the column's Python type

    config = OmegaConf.create(
        {"reward": {"reward_manager": {"source": "register", "name": "dapo"},
                    "custom_reward_function": {"path": "pkg://rpg.data.reward", "name": "compute_score"},
                    "reward_kwargs": {}}}
    )  # fmt: skip
    manager = load_reward_manager(config, tiny_tokenizer)
    ids = tiny_tokenizer.encode("Answer: 5", add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    data = DataProto.from_dict(
        tensors={"prompts": torch.full((1, 2), 65), "responses": torch.tensor([ids]),
                 "attention_mask": torch.ones(1, 2 + len(ids), dtype=torch.long)},
        non_tensors={k: batch[k] for k in ("data_source", "reward_model")},
    )  # fmt: skip
    out = manager.loop.run_until_complete(manager.run_single(data))
    assert out["reward_extra_info"]["acc"] is True and out["reward_score"] == 1.0


def test_the_math_verify_pool_is_started_once_outside_the_answer_timeout(monkeypatch):
    """The first Math-Verify call starts verl's subprocess pool with its own long wait (MATH_VERIFY_WARMUP_S), once;
    the answer's own 30 s timeout then measures the verification only."""
    from verl.utils.reward_score import math_verify

    waits, submitted = [], []

    class Future:
        def result(self, timeout=None):
            waits.append(timeout)
            return 1.0

    class Pool:
        def submit(self, fn, *args):
            submitted.append(args)
            return Future()

    import rpg.data.reward as reward_module

    monkeypatch.setattr(reward_module, "_math_verify_warm", False)
    monkeypatch.setattr(math_verify, "_get_pool", lambda: Pool())
    warm_before_scoring = []
    monkeypatch.setattr(math_verify, "compute_score", lambda *a, **k: warm_before_scoring.append(bool(waits)) or 1.0)
    for _ in range(3):
        assert reward_module.math_verify_score("so $\\boxed{5}$.", "5")["acc"] is True
    assert waits == [reward_module.MATH_VERIFY_WARMUP_S] and submitted == [("\\boxed{1}", "\\boxed{1}")]
    assert warm_before_scoring == [True, True, True]
