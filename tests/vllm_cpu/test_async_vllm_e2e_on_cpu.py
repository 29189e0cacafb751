"""verl's colocated asynchronous trainer with its own vLLM rollout on CPU (CPU_ROLLOUT=vllm; .venv-vllm's python).

One launch of `recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` with the recipe knob `TRAINER_MODE=colocate_async`: verl's
`FullyAsyncLLMServerClient` against the vLLM server, which is aborted after each sample (`pause_generation`), gets the
new weights and resumes partial responses (docs/async.md#modes). 2 steps of 4 prompts × 4 responses, two updates per
step, one batch generated ahead, no DAPO filtering (so step 2 trains on the batch generated ahead), validation on 32
held-out prompts after step 2, with what matters off-policy on top:

* the periodic reference (K = 2 optimizer steps = every training step with two mini-batches) and token-level TIS
  (`rollout_is=token`);
* the loss switched to the KL add-on over a non-RPG base (`rpg_kl_urkl` over `gspo`, sequence credit;
  docs/losses.md#kl-addon) with the top-k KL (k = 8, π_ref's support carried from the reference pass through the
  TransferQueue; docs/losses.md#topk-kl).

Checks: RPG metrics (the add-on's `actor/rpg/kl`, `kl_loss`, `topk_kl`, `kl_share`) and the TIS weights finite at
both steps; the staleness logged per step (0 at step 1; the batch of step 2 was generated, at least in part, by the
weights before step 1's update); π_old recomputed (the rollout−actor gap finite, and small at step 1: the sampling
weights); a reference forward and a refresh at both steps; validation finite. The `hf` rollout's own abort/resume is
tested in-process (tests/async/test_partial_rollout_on_cpu.py). About 4-8 minutes on 2 cores.
"""

from __future__ import annotations

import pytest
from cpu_trainer import finite, run_cpu_recipe, training_steps

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)

GAP = "training/rollout_probs_diff_mean"
STALENESS = "training/off_policy/trajectory_staleness"


def test_colocate_async_with_vllm_periodic_reference_tis_and_topk_addon(tiny_dir, tmp_path):
    overrides = [
        "data.val_max_samples=32", "trainer.val_before_train=False",
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
        # the KL computed at k = 8 tokens per position instead of sampled (docs/losses.md#topk-kl)
        "+actor_rollout_ref.actor.policy_loss.kl_estimator=topk", "+actor_rollout_ref.actor.policy_loss.kl_topk=8",
    ]  # fmt: skip
    records, text = run_cpu_recipe(tmp_path, "colocate_async_vllm", overrides, TRAINER_MODE="colocate_async",
                                   CPU_ROLLOUT="vllm", CPU_STEPS="2", CPU_TEST_FREQ="2", CPU_BATCH="4", CPU_N="4",
                                   CPU_MINI_BATCH="2", CPU_SEED="0")  # fmt: skip
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
        assert "timing_s/ref" in data, f"step {step}: no reference forward"
        assert {"actor/rpg/kl", "actor/rpg/kl_loss", "actor/rpg/topk_kl", "actor/rpg/kl_share"} <= set(data), sorted(data)
        print(f"step {step}: gap {data[GAP]:.3e}, staleness max {data[f'{STALENESS}/max']}, "
              f"worst {data[f'{STALENESS}_worst/max']}, spans {data['training/off_policy/trajectory_spans/max']}")
    # step 1 trains on the first batch (weights 0); the second batch was submitted with it and generated, at least
    # its first tokens, by weights 0 too, before step 1's update: one version stale in the worst case
    assert train[1][f"{STALENESS}/max"] == 0 and train[1][GAP] < 1e-3, train[1][GAP]
    assert train[2][f"{STALENESS}_worst/max"] >= 1, {k: v for k, v in train[2].items() if "off_policy" in k}
    assert [train[s]["actor/rpg/ref_refreshed"] for s in (1, 2)] == [1, 1]
    assert [train[s]["actor/rpg/ref_refresh_count"] for s in (1, 2)] == [1, 2]
    assert "[rpg.reference] reference <- policy at training step 2" in text
    val = train[2].get("val-core/math_dapo/acc/mean@1")
    assert finite(val) and 0.0 <= val <= 1.0, f"final validation: {val}"
