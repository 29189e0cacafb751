"""End to end on CPU: verl 0.9.1's unmodified trainer with the RPG plugin, through the project's own launcher.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` (common.sh + the CPU profile -> `python -m rpg.launch` -> verl's
`run_ppo`) runs RPG-REINFORCE-URKL with the `rpg` advantage estimator on the tiny model for 2 steps with validation
and a checkpoint, then a second process resumes from that checkpoint and runs step 3. Checks:

* the plugin runs inside the Ray actor workers: RPG metrics (`actor/rpg/...`) and `actor/pg_loss` are logged and
  finite at every step (verl's file logger, one JSON line per step); with two mini-batches per step the second
  update is off-policy, so the KL to the iterative reference π_old is non-zero (`actor/rpg/kl` > 0);
* validation ran (`val-core/...` accuracy in [0, 1]) and the rollout used the actor's current weights
  (`training/rollout_probs_diff_mean` ~ 0: the rollout and actor log-probs of the sampled tokens agree);
* the checkpoint was written at step 2 and the second run resumed from it (its first logged step is 3).

Cost: about 3-4 minutes on 2 cores (two trainer start-ups of ~40 s each), plus ~80 s once to build artifacts/tiny
if it is missing (rpg.tools.tiny_model, reused afterwards).
"""

import math
from pathlib import Path

import pytest
from cpu_trainer import ensure_tiny_model, run_cpu_recipe, training_steps


@pytest.fixture(scope="module")
def tiny_dir():
    return ensure_tiny_model()


def run_trainer(tmp: Path, name: str, steps: int, extra: list[str]) -> list[dict]:
    """2 mini-batches of 2 prompts × 4 responses per step, validation every 2 steps; returns the metric records."""
    records, _ = run_cpu_recipe(tmp, name, ["trainer.val_before_train=False", *extra], CPU_STEPS=str(steps),
                                CPU_BATCH="4", CPU_MINI_BATCH="2", CPU_N="4", CPU_TEST_FREQ="2", CPU_SEED="0")
    return records


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def check_training_steps(records: list[dict], steps: list[int]) -> None:
    train = training_steps(records)
    assert sorted(train) == steps, f"logged training steps {sorted(train)}, expected {steps}"
    for step, data in train.items():
        rpg = {k: v for k, v in data.items() if k.startswith("actor/rpg")}
        assert rpg, f"step {step}: no actor/rpg/* metrics; actor keys: {sorted(k for k in data if 'actor' in k)}"
        bad = {k: v for k, v in {**rpg, "actor/pg_loss": data["actor/pg_loss"]}.items() if not finite(v)}
        assert not bad, f"step {step}: non-finite metrics {bad}"
        assert "timing_s/ref" not in data  # iterative reference: no reference model forward
        # two optimizer steps per training step: the second is off-policy, so the KL to π_old is active
        assert data["actor/rpg/kl"] > 0, "the RPG KL term was never active"
        assert abs(data["training/rollout_probs_diff_mean"]) < 1e-3, "rollout and actor log-probs disagree"


def test_train_validate_checkpoint_resume(tiny_dir, tmp_path):
    first = run_trainer(tmp_path, "phase1", steps=2, extra=["trainer.save_freq=2", "trainer.resume_mode=disable"])
    check_training_steps(first, [1, 2])
    val = {k: v for r in first for k, v in r["data"].items() if k.startswith("val-core/") and "acc" in k}
    assert val and all(finite(v) and 0.0 <= v <= 1.0 for v in val.values()), f"validation metrics: {val}"
    ckpt = tmp_path / "ckpts"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir()

    second = run_trainer(tmp_path, "phase2", steps=3, extra=["trainer.save_freq=2", "trainer.resume_mode=auto"])
    check_training_steps(second, [3])
