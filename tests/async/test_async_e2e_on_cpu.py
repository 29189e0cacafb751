"""RPG where off-policy matters: bypass mode end to end on CPU.

One launch of `recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` (the project's launcher, the CPU profile, the tiny model,
the `hf` rollout) through the recipe knob OLD_LOGPROB (docs/async.md#knobs, docs/async.md#bypass): `OLD_LOGPROB=rollout`,
the sync trainer with `algorithm.rollout_correction.bypass_mode=True`; 2 steps of 4 prompts, one mini-batch per step,
8 validation prompts after step 2. π_old is the rollout's log-probs, so verl skips the actor's old-log-prob forward
(its products, `actor/entropy` and `training/rollout_probs_diff_*`, are absent and `timing_s/old_log_prob` is a copy);
the RPG metrics are finite, the staleness is logged (0: the sync trainer); the rollout−actor gap is visible in the
ratio itself: with one update per step the loss's forward runs at the weights that sampled the batch, so `w = π_θ/μ`
differs from 1 only by the engine/actor mismatch (`actor/rpg/ratio_*`).

verl's colocated asynchronous trainer (TRAINER_MODE=colocate_async) with the periodic reference, TIS and the top-k KL
add-on runs end to end with the vLLM rollout (tests/vllm_cpu/test_async_vllm_e2e_on_cpu.py); the `hf` rollout's
abort/resume that the mode needs on the CPU path is tested in-process (tests/async/test_partial_rollout_on_cpu.py).

Cost: about 1.5-2.5 minutes on 2 cores. Needs artifacts/tiny (rpg.tools.tiny_model, built once, reused).
"""


import pytest
from cpu_trainer import finite, run_cpu_recipe, training_steps

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)

STALENESS = "training/off_policy/trajectory_staleness"
VAL = "val-core/math_dapo/acc/mean@1"


def check_common(records: list[dict]) -> dict[int, dict]:
    """Steps 1 and 2 logged, with finite RPG metrics, a staleness record and a finite final validation."""
    train = training_steps(records)
    assert sorted(train) == [1, 2], f"logged training steps {sorted(train)}"
    for step, data in train.items():
        rpg = {k: v for k, v in data.items() if k.startswith("actor/rpg/")}
        assert rpg, f"step {step}: no actor/rpg/* metrics"
        bad = {k: v for k, v in {**rpg, "actor/pg_loss": data["actor/pg_loss"]}.items() if not finite(v)}
        assert not bad, f"step {step}: non-finite metrics {bad}"
        for stat in ("mean", "max", "min"):
            assert finite(data.get(f"{STALENESS}/{stat}")), f"step {step}: {STALENESS}/{stat} not logged"
    assert finite(train[2].get(VAL)) and 0.0 <= train[2][VAL] <= 1.0, f"final validation: {train[2].get(VAL)}"
    return train


def test_bypass_skips_the_old_log_prob_forward(tiny_dir, tmp_path):
    records, text = run_cpu_recipe(tmp_path, "bypass", ["trainer.val_before_train=False", "data.val_max_samples=8"],
                                   OLD_LOGPROB="rollout", CPU_STEPS="2", CPU_TEST_FREQ="2", CPU_BATCH="4", CPU_N="4",
                                   CPU_SEED="0")  # fmt: skip
    train = check_common(records)
    for step, data in train.items():
        # no actor forward before the update: its by-products are missing, the timer only wraps a tensor copy
        skipped = [k for k in data if k == "actor/entropy" or k.startswith("training/rollout_probs_diff")]
        assert not skipped, f"step {step}: metrics of the old-log-prob forward were logged in bypass: {skipped}"
        assert data["timing_s/old_log_prob"] < 0.25 * data["timing_s/update_actor"], data["timing_s/old_log_prob"]
        assert "rollout_corr/rollout_is_mean" not in data  # bypass: no TIS weights (they would be μ/μ ≡ 1)
        # sync trainer: the batch was sampled by the weights it is trained from
        assert data[f"{STALENESS}/max"] == 0
        # rollout−actor gap: one update per step, so the only forward of the loss is at the sampling weights
        gap = max(data["actor/rpg/ratio_max"] - 1.0, 1.0 - data["actor/rpg/ratio_min"])
        assert gap < 1e-3, f"step {step}: π_θ/μ at the sampling weights spans {gap:.2e} around 1 (fp32 expects ~1e-5)"
