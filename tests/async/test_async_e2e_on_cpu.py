"""RPG where off-policy matters: bypass mode and verl's colocated asynchronous trainer, end to end on CPU.

Two launches of `recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` (the project's launcher, the CPU profile, the tiny model,
the `hf` rollout) through the recipe knobs OLD_LOGPROB and TRAINER_MODE (docs/async.md#knobs), 2 training steps each,
validation after the last step (docs/async.md#bypass, docs/async.md#modes):

* **bypass** (`OLD_LOGPROB=rollout`: the sync trainer with `algorithm.rollout_correction.bypass_mode=True`; 2 steps
  of 4 prompts, one mini-batch per step, 8 validation prompts after step 2; SMOKE=1 is checked on two ranks,
  tests/ranks/test_two_ranks_e2e_on_cpu.py). π_old is the rollout's
  log-probs, so verl skips the actor's old-log-prob forward (its products, `actor/entropy` and
  `training/rollout_probs_diff_*`, are absent and `timing_s/old_log_prob` is a copy); the RPG metrics are finite; the
  rollout−actor gap is visible in the ratio itself: with one update per step the loss's forward runs at the weights
  that sampled the batch, so `w = π_θ/μ` differs from 1 only by the engine/actor mismatch (`actor/rpg/ratio_*`).
* **colocate_async** (`TRAINER_MODE=colocate_async`, 4 prompts × 4 responses, one batch generated ahead, partial rollouts through
  the hf server's abort/resume, no DAPO filtering so that step 2 trains on the batch generated ahead) with the periodic reference (K = 2 optimizer steps = every training step with two
  mini-batches) and token-level TIS (`rollout_is=token`), the loss switched to the KL add-on over a non-RPG base
  (`rpg_kl_urkl` over `gspo`, sequence credit; docs/losses.md#kl-addon) with the top-k KL (k = 8, π_ref's support
  carried from the reference pass through the TransferQueue; docs/losses.md#topk-kl): RPG metrics finite (the
  add-on's `actor/rpg/kl`, `kl_loss`, `topk_kl`, `kl_share`), the staleness logged at every step
  (the second batch was generated, at least in part, by the weights before step 1's update), the reference refreshed
  at both steps, the TIS weights computed, validation finite.

Cost: about 2 × 1.5-2.5 minutes on 2 cores. Needs artifacts/tiny (rpg.tools.tiny_model, built once, reused).
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


def test_colocate_async_with_periodic_reference_and_tis(tiny_dir, tmp_path):
    overrides = [
        "trainer.val_before_train=False",
        "trainer.v1.colocate_async.num_warmup_batches=1",
        "algorithm.filter_groups.enable=False",  # no DAPO eviction: step 2 trains on the batch generated ahead
        "algorithm.rollout_correction.rollout_is=token",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "+actor_rollout_ref.actor.policy_loss.reference=periodic",
        "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=2",
        # a non-RPG base plus the exact KL (docs/losses.md#kl-addon): GSPO + URKL with sequence credit, ρ ≠ 1
        "actor_rollout_ref.actor.policy_loss.loss_mode=rpg_kl_urkl",
        "+actor_rollout_ref.actor.policy_loss.base_loss_mode=gspo",
        "+actor_rollout_ref.actor.policy_loss.kl_credit=sequence",
        # the KL computed at k = 8 tokens per position instead of sampled (docs/losses.md#topk-kl): π_ref's support
        # selected in the reference pass, carried through the TransferQueue to the update
        "+actor_rollout_ref.actor.policy_loss.kl_estimator=topk", "+actor_rollout_ref.actor.policy_loss.kl_topk=8",
    ]
    records, text = run_cpu_recipe(tmp_path, "colocate_async", overrides, TRAINER_MODE="colocate_async",
                                   CPU_STEPS="2", CPU_BATCH="4", CPU_MINI_BATCH="2", CPU_N="4", CPU_TEST_FREQ="2",
                                   CPU_SEED="0")
    train = check_common(records)
    # step 1 trains on the first batch (weights 0); the second batch was submitted with it and generated, at least
    # its first tokens, by weights 0 too, before step 1's update: one version stale in the worst case
    assert train[1][f"{STALENESS}/max"] == 0
    assert train[2][f"{STALENESS}_worst/max"] >= 1, {k: v for k, v in train[2].items() if "off_policy" in k}
    for step, data in train.items():
        assert finite(data.get("rollout_corr/rollout_is_mean")), f"step {step}: no TIS weights"
        assert finite(data.get("training/rollout_probs_diff_mean")), f"step {step}: π_old was not recomputed"
        assert "timing_s/ref" in data, f"step {step}: no reference forward"
        assert {"actor/rpg/kl", "actor/rpg/kl_loss", "actor/rpg/topk_kl", "actor/rpg/kl_share"} <= set(data), sorted(data)
    assert [train[s]["actor/rpg/ref_refreshed"] for s in (1, 2)] == [1, 1]
    assert [train[s]["actor/rpg/ref_refresh_count"] for s in (1, 2)] == [1, 2]
    assert "[rpg.reference] reference <- policy at training step 2" in text
