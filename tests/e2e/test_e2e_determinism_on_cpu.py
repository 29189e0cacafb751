"""End to end on CPU: two runs of the CPU recipe with the same seed log the same numbers.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` (verl's trainer, the "hf" rollout, DAPO group filtering, two mini-batches
per step) runs twice with ``CPU_SEED=0``: validation before training and after step 2, four prompts × four samples
per step, so DAPO evicts and refills groups. Every logged number must be identical between the runs, except
wall-clock timings, throughput and memory: validation accuracy, rewards, losses, gradient norms, the RPG KL and the
DAPO counts. What makes this hold is documented in rpg/cpu/hf_rollout.py (per-request seeds) and rpg/cpu/sampler.py
(batches independent of completion timing).

Cost: two trainer runs, about 3 minutes on 2 cores.
"""

from pathlib import Path

import pytest
from cpu_trainer import ensure_tiny_model, run_cpu_recipe

# wall-clock and machine-state metrics, the only ones allowed to differ between two runs
TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")


@pytest.fixture(scope="module")
def tiny_dir():
    return ensure_tiny_model()


def run(tmp: Path, name: str) -> dict[int, dict]:
    records, _ = run_cpu_recipe(
        tmp, name, ["trainer.val_before_train=True", "actor_rollout_ref.rollout.val_kwargs.n=2"],
        CPU_STEPS="2", CPU_BATCH="4", CPU_MINI_BATCH="2", CPU_N="4", CPU_TEST_FREQ="2", CPU_SEED="0")
    by_step: dict[int, dict] = {}
    for r in records:
        by_step.setdefault(r["step"], {}).update(
            {k: v for k, v in r["data"].items() if not k.startswith(TIMING_PREFIXES)})
    return by_step


def test_same_seed_same_numbers(tiny_dir, tmp_path):
    first, second = run(tmp_path, "run1"), run(tmp_path, "run2")
    assert sorted(first) == [0, 1, 2]
    assert any(k.startswith("val-core/") for k in first[0]) and "actor/rpg/kl" in first[2]
    for step in first:
        diff = {k: (v, second[step].get(k)) for k, v in first[step].items() if second[step].get(k) != v}
        assert not diff and first[step].keys() == second[step].keys(), f"step {step} differs: {diff}"
