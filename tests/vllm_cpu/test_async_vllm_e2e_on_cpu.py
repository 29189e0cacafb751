"""verl's colocated asynchronous trainer with its own vLLM rollout on CPU (CPU_ROLLOUT=vllm; .venv-vllm's python).

One launch of `recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` with the recipe knob `TRAINER_MODE=colocate_async`: verl's
`FullyAsyncLLMServerClient` against the vLLM server, which is aborted after each sample (`pause_generation`), gets the
new weights and resumes partial responses (docs/async.md#modes). RPG-REINFORCE-URKL with the iterative reference and
token-level TIS, 2 steps of 4 prompts × 4 responses, two updates per step, one batch generated ahead, no DAPO
filtering (so step 2 trains on the batch generated ahead), validation on 32 held-out prompts after step 2. Checks:
RPG metrics and the TIS weights finite at both steps, the staleness logged per step (0 at step 1; the batch of step 2
was generated, at least in part, by the weights before step 1's update), the rollout−actor gap finite and small at
step 1 (π_old recomputed at the sampling weights), validation finite. About 2-3 minutes on 2 cores.
"""

from __future__ import annotations

import pytest
from cpu_trainer import finite, run_cpu_recipe, training_steps

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)

GAP = "training/rollout_probs_diff_mean"
STALENESS = "training/off_policy/trajectory_staleness"


def test_colocate_async_with_vllm(tiny_dir, tmp_path):
    overrides = ["data.val_max_samples=32", "trainer.val_before_train=False",
                 "trainer.v1.colocate_async.num_warmup_batches=1",
                 "algorithm.filter_groups.enable=False", "algorithm.rollout_correction.rollout_is=token"]
    records, _ = run_cpu_recipe(tmp_path, "colocate_async_vllm", overrides, TRAINER_MODE="colocate_async",
                                CPU_ROLLOUT="vllm", CPU_STEPS="2", CPU_TEST_FREQ="2", CPU_BATCH="4", CPU_N="4",
                                CPU_MINI_BATCH="2", CPU_SEED="0")
    train = training_steps(records)
    assert sorted(train) == [1, 2], f"logged training steps {sorted(train)}"
    for step, data in train.items():
        rpg = {k: v for k, v in data.items() if k.startswith("actor/rpg/")}
        assert rpg, f"step {step}: no actor/rpg/* metrics"
        watched = {**rpg, "actor/pg_loss": data["actor/pg_loss"], GAP: data.get(GAP),
                   "rollout_corr/rollout_is_mean": data.get("rollout_corr/rollout_is_mean"),
                   **{f"{STALENESS}/{s}": data.get(f"{STALENESS}/{s}") for s in ("mean", "max", "min")}}
        bad = {k: v for k, v in watched.items() if not finite(v)}
        assert not bad, f"step {step}: non-finite or missing metrics {bad}"
        print(f"step {step}: gap {data[GAP]:.3e}, staleness max {data[f'{STALENESS}/max']}, "
              f"worst {data[f'{STALENESS}_worst/max']}, spans {data['training/off_policy/trajectory_spans/max']}")
    assert train[1][f"{STALENESS}/max"] == 0 and train[1][GAP] < 1e-3, train[1][GAP]
    assert train[2][f"{STALENESS}_worst/max"] >= 1
    val = train[2].get("val-core/math_dapo/acc/mean@1")
    assert finite(val) and 0.0 <= val <= 1.0, f"final validation: {val}"
