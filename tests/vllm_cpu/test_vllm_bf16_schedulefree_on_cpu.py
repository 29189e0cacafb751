"""verl's vLLM rollout on CPU end to end, as the authors' GPU runs are set up: RPG-UFKL against the frozen reference
in bf16, with DAPO's group filtering and schedule-free AdamW (the `ufkl_frozen_bf16_sf` row of the matrix in
vllm_runs.py)."""

from __future__ import annotations

import re

import pytest
from cpu_trainer import run_cpu_recipe, training_steps
from vllm_runs import GAP, PROBE, SIZES, SMALL_VAL, check_rpg_step, gaps, val_steps

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)

PUSH = re.compile(r"\[sync_probe\] step (\d+): weights sum (\S+)")


def test_ufkl_frozen_bf16_with_group_filtering_and_schedule_free(tiny_dir, tmp_path):
    overrides = [*SMALL_VAL, "trainer.val_before_train=True", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.actor.kl_loss_coef=0.0", "+actor_rollout_ref.actor.policy_loss.reference=frozen"]
    sizes = {**SIZES, "CPU_N": "2", "CPU_MINI_BATCH": "2"}  # 2 responses per prompt: many uniform groups to evict
    records, console = run_cpu_recipe(tmp_path, "ufkl_frozen_bf16_sf", overrides, script="run_rpg_ufkl.sh",
                                      CPU_STEPS="3", CPU_TEST_FREQ="2", CPU_DTYPE="bf16", OPTIM="schedulefree",
                                      VLLM_LOGGING_LEVEL="INFO", **PROBE, **sizes)  # fmt: skip  (INFO: the engine config)
    train = training_steps(records)
    # verl logs the filter counts only at a step that evicted something: a step without them evicted nothing
    evicted = {s: train[s].get("training/filter_groups/evicted_samples", 0) for s in sorted(train)}
    pushes = [(int(step), float(total)) for step, total in PUSH.findall(console)]
    print(f"\n[vllm ufkl frozen bf16 schedulefree] {GAP} per step: {gaps(train)}; evicted {evicted}; pushes {pushes}")
    assert sorted(train) == [1, 2, 3]
    engine = [line for line in console.splitlines() if "Initializing a V1 LLM engine" in line]
    assert engine and all("dtype=torch.bfloat16" in line for line in engine), f"vLLM must run in bfloat16: {engine}"
    assert sum(evicted.values()) > 0, "no group was filtered"
    for step, data in train.items():
        check_rpg_step(step, data)
        assert "timing_s/ref" in data, "frozen reference: verl's reference worker runs every step"
        assert data[GAP] < 5e-2, f"step {step}: bf16 rollout and actor disagree far beyond rounding ({data[GAP]})"
    assert train[3]["actor/rpg/kl"] > 0, "the policy moved away from the frozen reference"
    assert val_steps(records) == [0, 2, 3]
    # start-up (x == y: nothing else before training); after each update (y); around each validation after an
    # optimizer step: x, then y back, bit for bit (so the next rollouts come from y; bf16's gap cannot tell)
    assert [step for step, _ in pushes] == [0, 1, 2, 2, 2, 3, 3, 3], pushes
    for y, x, y_back in (pushes[2:5], pushes[5:8]):
        assert y_back[1] == y[1] != x[1], f"step {y[0]}: pushed y {y[1]!r}, x {x[1]!r}, then {y_back[1]!r}"
