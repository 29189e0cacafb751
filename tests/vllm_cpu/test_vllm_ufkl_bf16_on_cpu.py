"""verl's vLLM rollout on CPU end to end: RPG-UFKL against the frozen reference in bf16 (the `ufkl_frozen_bf16` row
of the matrix in vllm_runs.py)."""

from __future__ import annotations

import pytest
from cpu_trainer import run_cpu_recipe, training_steps
from vllm_runs import GAP, SIZES, SMALL_VAL, check_rpg_step, gaps, val_steps

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)


# ----------------------------------------------------------------------------- RPG-UFKL, frozen reference, bf16 --
def test_ufkl_frozen_reference_bf16(tiny_dir, tmp_path):
    overrides = [*SMALL_VAL, "trainer.val_before_train=False", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.actor.kl_loss_coef=0.0", "+actor_rollout_ref.actor.policy_loss.reference=frozen"]
    records, console = run_cpu_recipe(tmp_path, "ufkl_frozen_bf16", overrides, script="run_rpg_ufkl.sh",
                                      CPU_STEPS="2", CPU_TEST_FREQ="2", CPU_DTYPE="bf16",
                                      VLLM_LOGGING_LEVEL="INFO", **SIZES)  # fmt: skip  (vLLM logs its engine config)
    train = training_steps(records)
    print(f"\n[vllm ufkl frozen bf16] {GAP} per step: {gaps(train)}; "
          f"max {[train[s]['training/rollout_probs_diff_max'] for s in sorted(train)]}")
    assert sorted(train) == [1, 2]
    engine = [line for line in console.splitlines() if "Initializing a V1 LLM engine" in line]
    assert engine and all("dtype=torch.bfloat16" in line for line in engine), f"vLLM must run in bfloat16: {engine}"
    for step, data in train.items():
        check_rpg_step(step, data)
        assert "timing_s/ref" in data, "frozen reference: verl's reference worker runs every step"
        assert data[GAP] < 5e-2, f"step {step}: bf16 rollout and actor disagree far beyond rounding ({data[GAP]})"
    assert train[2]["actor/rpg/kl"] > 0, "the policy moved away from the frozen reference"
    assert val_steps(records) == [2]
