"""verl's vLLM rollout on CPU end to end: the periodic reference on two ranks (the `urkl_periodic_2ranks` row of
the matrix in vllm_runs.py)."""

from __future__ import annotations

import pytest
from cpu_trainer import run_cpu_recipe, training_steps
from vllm_runs import GAP, SIZES, SMALL_VAL, check_rpg_step, gaps, val_steps

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)


# ------------------------------------------------------------------------------------------- periodic reference --
def test_urkl_periodic_reference_refreshes(tiny_dir, tmp_path):
    overrides = [*SMALL_VAL, "trainer.val_before_train=False", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.actor.kl_loss_coef=0.0", "+actor_rollout_ref.actor.policy_loss.reference=periodic",
                 "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=2"]
    # one optimizer step per training step (refreshed at the end of step 2); two ranks with 8 sequences each
    sizes = {**SIZES, "CPU_MINI_BATCH": "4", "CPU_RANKS": "2"}
    records, console = run_cpu_recipe(tmp_path, "urkl_periodic_2ranks", overrides, CPU_STEPS="3", CPU_TEST_FREQ="3",
                                      **sizes)  # fmt: skip
    train = training_steps(records)
    print(f"\n[vllm urkl periodic, 2 ranks] {GAP} per step: {gaps(train)}")
    assert sorted(train) == [1, 2, 3]
    for step, data in train.items():
        check_rpg_step(step, data)
        assert data[GAP] < 1e-3, f"step {step}: {data[GAP]}"
    assert [train[s]["actor/rpg/ref_refreshed"] for s in (1, 2, 3)] == [0, 1, 0]
    assert [train[s]["actor/rpg/ref_refresh_count"] for s in (1, 2, 3)] == [0, 1, 1]
    assert "[rpg.reference] reference <- policy at training step 2" in console
    # step 3: reference == policy after step 2 == π_old of step 3 (one update per step) -> zero KL before the update
    assert abs(train[3]["actor/rpg/ref_kl"]) < 1e-6 < train[2]["actor/rpg/ref_kl"], train
    assert val_steps(records) == [3]
