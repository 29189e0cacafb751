"""CPU_RANKS=2 end to end: verl 0.9.1's trainer with 2 FSDP2 ranks on CPU (gloo) through the project's launcher.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` with `CPU_RANKS=2` (2 actor ranks, 2 rollout replicas) and 2
micro-batches per rank (`ppo_micro_batch_size_per_gpu` = half a rank's share). Every run logs exactly its steps: one
line each in the JSON-lines metrics file and on the console, every `actor/rpg/*` metric finite
(`cpu_trainer.check_steps`).

* the smoke run (`SMOKE=1`, rpg/smoke.py) with the periodic reference and schedule-free AdamW, with the wandb logger
  (offline), which reaches every moment that fails late: launch 1 runs step 1 and saves its checkpoint under the
  smoke folder (RPG_SMOKE_DIR), with schedule-free's HF export of the average x; launch 2 (a new process, as a user's
  resume) resumes it and runs step 2 and a validation; the periodic refresh is forced at every step (K = 1 instead of
  the recipe's 64) and each rank checks its shards: reference = actor after the refresh; the configured logger (wandb)
  is initialised; the run's CKPTS_DIR is untouched; the smoke report follows. The refresh at step 1 sets the reference
  to the policy that samples step 2 (π_old, one mini-batch per step), so at step 2 verl's own KL-loss metric (k3
  against `ref_log_prob`) and the periodic reference's KL are ~0 only if the resumed run restored the *refreshed*
  reference on both ranks; the checkpoint's HF export is the average x, bit for bit; the adaptive β
  (`kl_control=adaptive`) follows its recurrence on the all-reduced KL, and the resumed step 2 uses exactly the β the
  first launch computed after step 1 (its state restored from the checkpoint);
Schedule-free with two optimizer steps per training step (x ≠ y, so the export is told from the iterate), the
iterative KL active and the rollout's y/x weight pushes around validation are checked in the end-to-end run of
tests/e2e/test_e2e_trainer_on_cpu.py, on one rank, without a trainer start-up of its own.

Cost: two trainer start-ups (the smoke run's two launches), ~4 min on 2 cores. Needs artifacts/tiny.
"""

from __future__ import annotations

import json
import re

import pytest
from cpu_trainer import TRAINER_TIMEOUT_S, assert_hf_export_is_x, check_steps, run_cpu_recipe

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)

SIZES = dict(CPU_RANKS="2", CPU_BATCH="4", CPU_N="4", CPU_SEED="0")  # 16 sequences per step, 8 per rank
BETA_TARGET, BETA_H = 1e-4, 2.0  # the adaptive β (docs/losses.md#adaptive-beta) on the smoke run


# the smoke run's overrides, one list (a further property of the same run is one more line here)
SMOKE_OVERRIDES = [
    "trainer.logger=[console,wandb]",  # the smoke run keeps it (and adds verl's file logger); offline: WANDB_MODE
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.policy_loss.reference=periodic",
    "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=64",  # the recipe's K: the smoke run forces K = 1
    "+actor_rollout_ref.actor.policy_loss.kl_control=adaptive",
    f"+actor_rollout_ref.actor.policy_loss.kl_target={BETA_TARGET}",
    f"+actor_rollout_ref.actor.policy_loss.kl_horizon={BETA_H}",
]


def test_smoke_run_checkpoints_resumes_refreshes_and_exports_on_two_ranks(tiny_dir, tmp_path):
    # RPG_SMOKE_DIR=tmp_path: launch 2 logs to tmp_path/smoke_2r.jsonl, the file run_cpu_recipe reads
    smoke_dir, run_ckpts = tmp_path, tmp_path / "run-ckpts"
    records, text = run_cpu_recipe(tmp_path, "smoke_2r", SMOKE_OVERRIDES, timeout_s=2 * TRAINER_TIMEOUT_S, SMOKE="1",
                                   RPG_SMOKE_DIR=str(smoke_dir), CKPTS_DIR=str(run_ckpts), OPTIM="schedulefree",
                                   WANDB_MODE="offline", WANDB_DIR=str(tmp_path),
                                   RAY_DEDUP_LOGS="0",  # Ray would merge the two ranks' similar log lines
                                   **SIZES)  # fmt: skip
    step1 = [json.loads(line) for line in (smoke_dir / "smoke_2r.step1.jsonl").read_text().splitlines()]
    train = check_steps(step1 + records, text, [1, 2])  # launch 1 logged step 1, launch 2 step 2
    ckpt = smoke_dir / "ckpts" / "smoke_2r" / "global_step_1"
    assert f"[rpg smoke] checkpoint of step 1 saved under the smoke folder: {ckpt} (" in text, text[-3000:]
    assert f"the run's CKPTS_DIR ({run_ckpts}) is not touched" in text and not run_ckpts.exists()
    assert f"[rpg smoke] resumed from {ckpt} in a second launch and finished step 2" in text
    assert sorted(r["step"] for r in records if "actor/pg_loss" in r["data"]) == [2]  # launch 2 began at step 2
    assert any(k.startswith("val-core/") for k in train[2]), "no validation after step 2"
    for step in (1, 2):  # forced refresh (K = 1), checked on both ranks
        assert train[step]["actor/rpg/ref_refreshed"] == 1, (step, train[step])
        for rank in (0, 1):
            assert re.search(rf"\[rpg.reference\] rank {rank}: reference = actor after the refresh at training step "
                             rf"{step} \(\d+ shard tensors equal", text), (step, rank)  # fmt: skip
    # the resumed reference is the step-1 policy on both ranks: zero KL on the on-policy step 2
    assert abs(train[2]["actor/kl_loss"]) < 1e-6 and abs(train[2]["actor/rpg/ref_kl"]) < 1e-6, train[2]
    assert f"[rpg.schedule_free] HF export of the average x at step 1: {ckpt / 'actor' / 'huggingface'}" in text
    assert_hf_export_is_x(ckpt / "actor", world_size=2, distinct=False)  # one optimizer step: x = y = z
    assert list((tmp_path / "wandb").glob("offline-run-*")), "the configured logger (wandb) was not initialised"
    assert "[rpg smoke] steps [1, 2]" in text and "projected wall time of the full run" in text
    # the rollout/trainer mismatch judged from verl's metrics, with the share a smoke run installs (rpg/mismatch.py)
    for step in (1, 2):
        assert train[step]["training/rollout_logp_diff_share"] == 0.0, (step, train[step])  # fp32 on CPU
    assert "[rpg smoke] rollout/trainer mismatch: |Δ probability| mean" in text, text[-3000:]
    assert "tokens with |Δ log p| > log 2: 0.000%" in text and "  verdict: OK (heuristic thresholds" in text
    # the adaptive β rides on this run: it follows its recurrence, and the resumed launch continues it exactly
    for step in (1, 2):
        kl, beta = train[step]["actor/rpg/kl_ctrl_kl"], train[step]["actor/rpg/kl_coef"]
        assert train[step]["actor/rpg/kl_coef_next"] == beta * (1 + min(max(kl / BETA_TARGET - 1, -0.2), 0.2) / BETA_H)
    assert train[1]["actor/rpg/kl_coef"] == 1e-4  # the recipe's kl_coef
    assert train[2]["actor/rpg/kl_coef"] == train[1]["actor/rpg/kl_coef_next"] != train[1]["actor/rpg/kl_coef"]
