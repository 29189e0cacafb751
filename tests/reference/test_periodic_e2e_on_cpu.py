"""reference='periodic' end to end: verl 0.9.1's unmodified trainer on CPU, RPG-REINFORCE-URKL, 3 training steps.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` (the project's launcher, CPU profile, tiny model) with the reference model
enabled (`use_kl_loss=True`, `kl_loss_coef=0`) and `reference=periodic`, K = 2 optimizer steps. The CPU profile uses
one mini-batch per step (1 optimizer step), so the reference is refreshed at the end of step 2 only. Checks, from
verl's own metrics log:

* the hooks run inside the Ray actor worker: `actor/rpg/ref_refreshed` is 0, 1, 0 and the refresh count 0, 1, 1;
  verl ran its reference forward (`timing_s/ref`) at every step;
* the refresh really replaced the reference model: at step 3 the policy being updated (= π_old, one mini-batch, first
  and only forward before the optimizer step) equals the reference, so verl's own KL-loss metric `actor/kl_loss`
  (k3 vs `ref_log_prob`) and our `actor/rpg/ref_kl` are ~0, while at step 2 (reference = initial model) they are not.

Cost: about 1.5-2 minutes on 2 cores (one trainer start-up of ~40 s). Needs artifacts/tiny
(rpg.tools.tiny_model, built once, ~80 s, reused).
"""

import pytest
from cpu_trainer import run_cpu_recipe, training_steps

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)


def test_periodic_reference_refreshes_inside_the_real_trainer(tiny_dir, tmp_path):
    overrides = [
        "trainer.val_before_train=False", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.policy_loss.reference=periodic",
        "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=2",
    ]
    records, text = run_cpu_recipe(tmp_path, "periodic", overrides, CPU_STEPS="3", CPU_BATCH="4", CPU_N="4",
                                   CPU_TEST_FREQ="-1", CPU_SEED="0")  # no validation: nothing here checks it
    train = training_steps(records)
    assert sorted(train) == [1, 2, 3], f"logged steps {sorted(train)}"

    assert [train[s]["actor/rpg/ref_refreshed"] for s in (1, 2, 3)] == [0, 1, 0]
    assert [train[s]["actor/rpg/ref_refresh_count"] for s in (1, 2, 3)] == [0, 1, 1]
    assert all("timing_s/ref" in train[s] for s in (1, 2, 3))
    assert "[rpg.reference] reference <- policy at training step 2" in text
    # step 3: reference == policy after step 2 == π_old of step 3 -> zero KL on the (only) forward before the step
    assert abs(train[3]["actor/kl_loss"]) < 1e-6 and abs(train[3]["actor/rpg/ref_kl"]) < 1e-6, train[3]
    # step 2: reference == initial model, policy moved at step 1 -> positive KL
    assert train[2]["actor/kl_loss"] > 1e-6 and train[2]["actor/rpg/ref_kl"] > 1e-6, train[2]
