"""The real-model comparison's numbers in docs/benchmarks.md#real-model are its committed record's
(benchmarks/records/real_model.json, written by `benchmarks/e2e_cpu_runs.py real-model`): the table between the docs'
markers is rendered from the record here and must match byte for byte, so the two cannot drift; and every run of
both methods ends at least 2 standard errors above the initial model (issue's bar: the larger of the two s.e.)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "benchmarks" / "records" / "real_model.json"
sys.path.insert(0, str(REPO / "benchmarks"))  # the renderer lives with the script that writes the record

import e2e_cpu_runs  # noqa: E402


def docs_block() -> str:
    text = e2e_cpu_runs.DOCS.read_text()
    assert text.count(e2e_cpu_runs.TABLE_START) == 1 and text.count(e2e_cpu_runs.TABLE_END) == 1
    return text.split(e2e_cpu_runs.TABLE_START, 1)[1].split(e2e_cpu_runs.TABLE_END, 1)[0].strip("\n")


def test_the_docs_table_is_the_committed_record():
    assert RECORD.is_file(), f"{RECORD.relative_to(REPO)} is not committed (benchmarks/e2e_cpu_runs.py real-model)"
    record = json.loads(RECORD.read_text())
    assert docs_block() == e2e_cpu_runs.real_model_table(record)
    assert e2e_cpu_runs.FIGURE.is_file(), "the record's figure docs/img/real-model-curves.png is not committed"
    assert set(record["runs"]) == {f"{m}_s{s}" for m in e2e_cpu_runs.REAL_MODEL_METHODS for s in (0, 1)}
    assert record["settings"]["CPU_LR"] == e2e_cpu_runs.REAL_MODEL["CPU_LR"]  # the settings the docs state


def test_every_run_ends_two_standard_errors_above_the_initial_model():
    record = json.loads(RECORD.read_text())
    initial = record["initial"]
    for name, run in record["runs"].items():
        final = run["final"]
        bar = initial["mean@k"] + 2 * max(initial["se"], final["se"])
        assert final["mean@k"] >= bar, (name, final["mean@k"], bar)


def test_the_table_renders_a_record():
    """The renderer itself, on a hand-made record (so a broken renderer fails before a record exists)."""
    evaluation = {"mean@k": 0.25, "se": 0.05, "se_sampling": 0.02, "best@k": 0.5, "n_problems": 32, "n_samples": 128}
    run = {"val_acc": {"0": 0.2, "10": 0.4}, "final": dict(evaluation, **{"mean@k": 0.45}), "mean_step_s": 61.2,
           "wall_s": 1500.0}
    record = {"settings": {"eval_k": 4, "val_kwargs.n": 2}, "initial": evaluation, "runs": {"grpo_s0": run}}
    table = e2e_cpu_runs.real_model_table(record).splitlines()
    assert table[2] == "| initial model | | 0.250 ± 0.050 | | | | |"
    assert table[3] == "| grpo_s0 | 0: 0.20, 10: 0.40 | 0.450 ± 0.050 | +0.200 (+4.0 s.e.) | yes | 61 | 25 min |"
