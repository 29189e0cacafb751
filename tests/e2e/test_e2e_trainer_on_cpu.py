"""End to end on CPU: verl 0.9.1's unmodified trainer with the RPG plugin, through the project's own launcher.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` (common.sh + the CPU profile -> `python -m rpg.launch` -> verl's
`run_ppo`; the "hf" rollout, DAPO group filtering) runs RPG-REINFORCE-URKL with the `rpg` advantage estimator on the
tiny model: 2 steps of four prompts × four samples (so DAPO evicts and refills groups), two mini-batches per step,
validation before training and after step 2 (32 held-out prompts, 2 samples each), a checkpoint at step 2. Two
trainer processes, started at once for the tests of this module:

* ``first``   the run above;
* ``second``  the same run again with the same seed (``CPU_SEED=0``), in its own folder.

Checks:

* the plugin runs inside the Ray actor workers: RPG metrics (`actor/rpg/...`) and `actor/pg_loss` are logged and
  finite at every step (verl's file logger, one JSON line per step); with two mini-batches per step the second
  update is off-policy, so the KL to the iterative reference π_old is non-zero (`actor/rpg/kl` > 0);
* validation ran (`val-core/...` accuracy in [0, 1]) and the rollout used the actor's current weights
  (`training/rollout_probs_diff_mean` ~ 0: the rollout and actor log-probs of the sampled tokens agree);
* the checkpoint was written at step 2 (resuming from a checkpoint through this trainer is proven on two ranks,
  tests/ranks/test_two_ranks_e2e_on_cpu.py, and with the vLLM rollout, tests/vllm_cpu/test_vllm_e2e_on_cpu.py);
* same seed, same numbers: every logged number of ``first`` and ``second`` is identical, except wall-clock timings,
  throughput and memory: validation accuracy, rewards, losses, gradient norms, the RPG KL and the DAPO counts. What
  makes this hold is documented in rpg/cpu/hf_rollout.py (per-request seeds) and rpg/cpu/sampler.py (batches
  independent of completion timing).

Cost: two trainer start-ups at the same time, about 2.5 minutes on 2 cores (artifacts/tiny is built once per session
if missing).
"""

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cpu_trainer import run_cpu_recipe, training_steps

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)

# wall-clock and machine-state metrics, the only ones allowed to differ between two runs
TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
SIZES = dict(CPU_BATCH="4", CPU_MINI_BATCH="2", CPU_N="4", CPU_TEST_FREQ="2", CPU_SEED="0")
VALIDATION = ["data.val_max_samples=32", "actor_rollout_ref.rollout.val_kwargs.n=2"]


def run_trainer(tmp: Path, name: str) -> list[dict]:
    """2 steps of 2 mini-batches of 2 prompts × 4 responses, validation before training and every 2 steps, a
    checkpoint every 2 steps; returns the metric records."""
    overrides = [*VALIDATION, "trainer.save_freq=2", "trainer.val_before_train=True", "trainer.resume_mode=disable"]
    records, _ = run_cpu_recipe(tmp, name, overrides, CPU_STEPS="2", **SIZES)
    return records


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory) -> dict:
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("first", "second")}
    with ThreadPoolExecutor(2) as pool:  # two independent trainers (own Ray each) at once: the critical path halves
        started = {name: pool.submit(run_trainer, d, name) for name, d in dirs.items()}
        records = {name: f.result() for name, f in started.items()}
    return {**records, "ckpt": dirs["first"] / "ckpts"}


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


def by_step(records: list[dict]) -> dict[int, dict]:
    """step -> every logged number but the wall-clock ones."""
    steps: dict[int, dict] = {}
    for r in records:
        steps.setdefault(r["step"], {}).update(
            {k: v for k, v in r["data"].items() if not k.startswith(TIMING_PREFIXES)})
    return steps


def test_train_validate_checkpoint(runs):
    first = runs["first"]
    check_training_steps(first, [1, 2])
    val = {k: v for r in first for k, v in r["data"].items() if k.startswith("val-core/") and "acc" in k}
    assert val and all(finite(v) and 0.0 <= v <= 1.0 for v in val.values()), f"validation metrics: {val}"
    assert (runs["ckpt"] / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (runs["ckpt"] / "global_step_2" / "actor").is_dir()


def test_same_seed_same_numbers(runs):
    first, second = by_step(runs["first"]), by_step(runs["second"])
    assert sorted(first) == [0, 1, 2]
    assert any(k.startswith("val-core/") for k in first[0]) and "actor/rpg/kl" in first[2]
    for step in first:
        diff = {k: (v, second[step].get(k)) for k, v in first[step].items() if second[step].get(k) != v}
        assert not diff and first[step].keys() == second[step].keys(), f"step {step} differs: {diff}"
