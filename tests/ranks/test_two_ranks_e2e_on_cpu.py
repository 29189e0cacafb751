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
* schedule-free AdamW with the iterative RPG loss and its KL active (2 mini-batches per step): validation before
  training and at step 2, a checkpoint with the HF export at step 2. Each rollout replica gets the iterate y after
  every update and the average x around validation (the servers' weight pushes: steps 0, 1, 2, 2, 2 per replica);
  rollout and π_old agree (`training/rollout_probs_diff_mean` ~ 0); the KL to π_old is non-zero; both ranks wrote
  their checkpoint shards with the optimizer in train mode (y), and the HF export is the average x, bit for bit.

Cost: three trainer start-ups (two for the smoke run), ~5 min on 2 cores. Needs artifacts/tiny.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
import torch
from cpu_trainer import check_steps, run_cpu_recipe

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)

SIZES = dict(CPU_RANKS="2", CPU_BATCH="4", CPU_N="4", CPU_SEED="0")  # 16 sequences per step, 8 per rank
SMALL_VAL = ["data.val_max_samples=32"]  # validation on 32 of the 200 held-out prompts: only its steps are checked
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
    records, text = run_cpu_recipe(tmp_path, "smoke_2r", SMOKE_OVERRIDES, timeout_s=900, SMOKE="1",
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


def test_schedule_free_with_the_iterative_kl_on_two_ranks(tiny_dir, tmp_path):
    overrides = [
        *SMALL_VAL, "trainer.val_before_train=True", "trainer.save_freq=2", "trainer.resume_mode=disable",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # 2 micro-batches per rank and mini-batch
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ]
    records, text = run_cpu_recipe(tmp_path, "sf_2r", overrides, timeout_s=900, OPTIM="schedulefree",
                                   CPU_STEPS="2", CPU_MINI_BATCH="2", CPU_TEST_FREQ="2",
                                   RAY_DEDUP_LOGS="0",  # Ray would merge the two replicas' similar log lines
                                   **SIZES)  # fmt: skip
    train = check_steps(records, text, [1, 2])
    for step, data in train.items():
        assert abs(data["training/rollout_probs_diff_mean"]) < 1e-4, (step, data["training/rollout_probs_diff_mean"])
        assert data["actor/rpg/kl"] > 0, (step, "the RPG KL to π_old was never active")
    val_steps = sorted(r["step"] for r in records if any(k.startswith("val-core/") for k in r["data"]))
    assert val_steps == [0, 2]
    pushes = defaultdict(list)
    for replica, step in re.findall(r"HFRolloutServer\[(\d+)\] weights <- step (\d+)", text):
        pushes[replica].append(step)
    assert sorted(pushes) == ["0", "1"], pushes  # one replica per rank
    for replica, steps in pushes.items():  # y after each update; x before validation at step 2, y after it
        assert steps == ["0", "1", "2", "2", "2"], (replica, steps)
    ckpt = tmp_path / "ckpts" / "global_step_2" / "actor"
    for rank in (0, 1):
        optim = torch.load(ckpt / f"optim_world_size_2_rank_{rank}.pt", weights_only=False)
        group = optim["param_groups"][0]
        assert group["train_mode"] is True and group["k"] == 4, (rank, group["train_mode"], group["k"])
    assert_hf_export_is_x(ckpt, world_size=2)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def assert_hf_export_is_x(ckpt, world_size: int, distinct: bool = True) -> None:
    """The checkpoint holds y and a train-mode optimizer, and its `huggingface/` export is the average x = lerp(y, z,
    1 - 1/β1) (schedulefree's eval()), bit for bit, reassembled from the ranks' FSDP2 shards (dim 0); with `distinct`
    (k ≥ 2 optimizer steps), x ≠ y somewhere (else the export could not be told from the training iterate; after a
    single step schedule-free's x, y and z coincide)."""
    from safetensors.torch import load_file

    models = [torch.load(ckpt / f"model_world_size_{world_size}_rank_{r}.pt", weights_only=False)
              for r in range(world_size)]  # fmt: skip
    optims = [torch.load(ckpt / f"optim_world_size_{world_size}_rank_{r}.pt", weights_only=False)
              for r in range(world_size)]  # fmt: skip
    beta1 = optims[0]["param_groups"][0]["betas"][0]
    # optimizer state is indexed in parameter order = state_dict order without the (last, tied) lm_head
    names = [n for n in models[0] if not n.endswith("lm_head.weight")]
    hf = load_file(ckpt / "huggingface" / "model.safetensors")
    differs, compared = False, 0
    for i, name in enumerate(names):
        states = [o["state"].get(i) for o in optims]
        if any(s is None for s in states) or name not in hf:
            continue
        y = torch.cat([local(m[name]) for m in models])
        z = torch.cat([local(s["z"]) for s in states])
        x = torch.lerp(y, z, 1 - 1 / beta1)
        torch.testing.assert_close(hf[name].float(), x.to(hf[name].dtype).float(), rtol=0, atol=0)
        differs |= not torch.equal(x.to(hf[name].dtype), y.to(hf[name].dtype))
        compared += 1
    assert compared >= len(names) - 1, (compared, len(names))
    assert differs or not distinct, "x == y everywhere: the HF export cannot be distinguished from the training iterate"
