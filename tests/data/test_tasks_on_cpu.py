"""The real-model task (docs/benchmarks.md#real-model): the last-number scorer over verl's GSM8K flexible extraction,
the seeded task generator (deterministic, disjoint splits) and its rpg-prepare-data rows."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rpg.data import reward, tasks


@pytest.mark.parametrize(
    ("response", "truth", "acc", "pred"),
    [
        ("3 + 7 = 10", "10", True, "10"),
        ("The answer is 12.", "12", True, "12"),  # verl's pattern keeps the full stop: "12." would not match
        ("It is 1,000, I think", "1000", True, "1000"),
        ("12.0", "12", True, "12.0"),
        ("The answer is 21.\nAlso 5 * 7 = 35", "21", False, "35"),  # the *last* number
        ("-3", "-3", True, "-3"),
        ("no number here.", "4", False, "[INVALID]"),
        ("1.2.3", "1", False, "1.2.3"),
    ],
)
def test_last_number_score(response, truth, acc, pred):
    got = reward.compute_score("last_number", response, truth)
    assert got == {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def test_last_number_is_routed_and_named():
    assert reward.scorer_for("last_number") is reward.last_number_score
    assert reward.has_scorer("last_number")
    assert "last_number" in reward.own_sources()
    assert reward.compute_score("last_number", "so 9", 9)["acc"]  # an integer ground truth, as parquet may give it


def test_every_task_has_distinct_questions_and_right_answers():
    for name in tasks.TASKS:
        problems = tasks.problems(name)
        assert len({q for q, _ in problems}) == len(problems), name
        assert 0 < tasks.chance(name) < 0.2, name
    assert ("What is 3 + 7? Reply with only the number.", 10) in tasks.problems("add1-short")
    assert len(tasks.problems("add1-short")) == 81
    assert ("What is 9 times 8?", 72) in tasks.problems("mul1")


def test_split_is_seeded_and_disjoint():
    train, val = tasks.split("add1-short", seed=0, n_val=32)
    assert (train, val) == tasks.split("add1-short", seed=0, n_val=32)
    assert len(val) == 32 and len(train) == 81 - 32
    assert not {q for q, _ in train} & {q for q, _ in val}
    assert tasks.split("add1-short", seed=1, n_val=32)[1] != val
    assert len(tasks.split("add2", seed=0, n_val=10, n_train=20)[0]) == 20


def test_split_sizes_that_do_not_fit_name_the_limits():
    with pytest.raises(tasks.TaskError, match=r"task 'add1-short' has 81 problems: choose 1 <= n_val < 81"):
        tasks.split("add1-short", seed=0, n_val=81)
    with pytest.raises(tasks.TaskError, match=r"unknown task 'add3'; valid: add1, sub1"):
        tasks.problems("add3")


def test_prepare_data_writes_the_seeded_split(tmp_path, capsys):
    from rpg.tools import prepare_data

    assert prepare_data.main(["arith-add1-short", "--out-dir", str(tmp_path), "--val-size", "20"]) == 0
    assert "train 61, validation 20 (disjoint)" in capsys.readouterr().out
    train = pq.read_table(tmp_path / "arith-add1-short" / "train.parquet").to_pylist()
    val = pq.read_table(tmp_path / "arith-add1-short" / "val.parquet").to_pylist()
    expected_val = tasks.split("add1-short", seed=0, n_val=20)[1]
    assert [(r["prompt"][0]["content"], int(r["reward_model"]["ground_truth"])) for r in val] == expected_val
    assert {r["data_source"] for r in train + val} == {"last_number"}
    assert [r["extra_info"]["split"] for r in val] == ["val"] * 20
    assert prepare_data.main(["arith-add1-short", "--out-dir", str(tmp_path), "--val-size", "81"]) == 2
    assert "choose 1 <= n_val < 81" in capsys.readouterr().err
