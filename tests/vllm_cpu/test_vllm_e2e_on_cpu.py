"""verl's vLLM rollout on CPU end to end: RPG-REINFORCE-URKL with the iterative reference, and its resume with a
negative control (the `urkl` and `urkl_resume_stale` rows of the matrix in vllm_runs.py)."""

from __future__ import annotations

import re

import pytest
from cpu_trainer import run_cpu_recipe, training_steps
from vllm_runs import GAP, PROBE, SIZES, SMALL_VAL, check_rpg_step, gaps, val_steps

from rpg.mismatch import report_lines

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)


# ---------------------------------------------------------------------------- RPG-REINFORCE-URKL + resume --
@pytest.fixture(scope="module")
def urkl(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_urkl")
    records, console = run_cpu_recipe(tmp, "urkl", [*SMALL_VAL, "trainer.val_before_train=True",
                                                    "trainer.save_freq=2"],
                                      CPU_STEPS="2", CPU_TEST_FREQ="2", **SIZES)  # fmt: skip
    return tmp, records, console


def test_urkl_iterative_syncs_every_step(urkl):
    tmp, records, console = urkl
    train = training_steps(records)
    print(f"\n[vllm urkl fp32] {GAP} per step: {gaps(train)}")
    assert sorted(train) == [1, 2]
    for step, data in train.items():
        check_rpg_step(step, data)
        assert "timing_s/ref" not in data  # iterative reference: no reference model
        assert data["actor/rpg/kl"] > 0, "two updates per step: the KL to π_old must be active"
        assert 0 <= data[GAP] < 1e-3, f"step {step}: vLLM sampled with other weights than the actor's ({data[GAP]})"
    progress = [int(m) for m in re.findall(r"\bstep:(\d+) - ", console)]
    assert progress == [0, 1, 2], f"one console line per step (0 = validation before training): {progress}"
    assert val_steps(records) == [0, 2]
    assert (tmp / "ckpts" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    mismatch = report_lines(train)  # the smoke report's mismatch line from verl's metrics (rpg/mismatch.py)
    print(mismatch)
    assert "rollout/trainer mismatch: |Δ probability| mean" in mismatch and "verdict: OK" in mismatch, mismatch


def test_resume_reaches_vllm_and_a_missing_sync_shows(urkl):
    tmp, _, _ = urkl
    records, console = run_cpu_recipe(tmp, "urkl_resume_stale", [*SMALL_VAL, "trainer.resume_mode=auto"],
                                      CPU_STEPS="4", CPU_TEST_FREQ="-1", RPG_TEST_SYNC="first-only", **PROBE,
                                      **SIZES)  # fmt: skip
    train = training_steps(records)
    gap = gaps(train)
    print(f"\n[vllm resume + stale control] {GAP} per step: {gap}")
    assert sorted(train) == [3, 4], "resumed from the step-2 checkpoint"
    for step, data in train.items():
        check_rpg_step(step, data)
    assert "[sync_probe] dropped the weights of step 3" in console
    assert gap[3] < 1e-3, "the start-up sync after resuming must load the checkpoint's weights into vLLM"
    assert gap[4] > 1e-3 and gap[4] > 100 * gap[3], f"a stale engine must show in {GAP}: {gap}"
