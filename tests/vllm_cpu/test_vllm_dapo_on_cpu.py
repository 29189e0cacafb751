"""verl's vLLM rollout on CPU end to end: DAPO with group filtering and schedule-free AdamW (the
`dapo_schedulefree` row of the matrix in vllm_runs.py)."""

from __future__ import annotations

import re

import pytest
from cpu_trainer import run_cpu_recipe, training_steps
from vllm_runs import GAP, PROBE, SIZES, SMALL_VAL, finite, gaps, val_steps

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)


# ----------------------------------------------------------------------------------- DAPO + schedule-free --
def test_dapo_filter_groups_schedulefree(tiny_dir, tmp_path):
    overrides = [*SMALL_VAL, "trainer.val_before_train=True"]
    sizes = {**SIZES, "CPU_N": "2", "CPU_MINI_BATCH": "2"}  # 2 responses per prompt: many uniform groups to evict
    records, console = run_cpu_recipe(tmp_path, "dapo_schedulefree", overrides, script="run_dapo.sh",
                                      CPU_STEPS="3", CPU_TEST_FREQ="2", OPTIM="schedulefree", **PROBE,
                                      **sizes)  # fmt: skip
    train = training_steps(records)
    # verl logs the filter counts only at a step that evicted something: a step without them evicted nothing
    evicted = {s: train[s].get("training/filter_groups/evicted_samples", 0) for s in sorted(train)}
    print(f"\n[vllm dapo schedulefree] {GAP} per step: {gaps(train)}; evicted {evicted}")
    assert sorted(train) == [1, 2, 3]
    assert sum(evicted.values()) > 0, "no group was filtered"
    for step, data in train.items():
        assert finite(data["actor/pg_loss"])
        assert data[GAP] < 1e-3, f"step {step}: rollouts must come from y ({data[GAP]})"
    assert val_steps(records) == [0, 2, 3]
    pushes = [int(s) for s in re.findall(r"\[sync_probe\] weights <- step (\d+)", console)]
    # start-up (x == y: nothing else before training); after each update (y); around each validation after an
    # optimizer step: x, then y back
    assert pushes == [0, 1, 2, 2, 2, 3, 3, 3], pushes
