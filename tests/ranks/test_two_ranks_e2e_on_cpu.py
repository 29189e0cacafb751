"""CPU_RANKS=2 end to end: verl 0.9.1's trainer with 2 FSDP2 ranks on CPU (gloo) through the project's launcher.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` with `CPU_RANKS=2` (2 actor ranks, 2 rollout replicas) and 2
micro-batches per rank (`ppo_micro_batch_size_per_gpu` = half a rank's share). Every run logs exactly its steps: one
line each in the JSON-lines metrics file and on the console, every `actor/rpg/*` metric finite
(`cpu_trainer.check_steps`).

* periodic reference + checkpoint → resume: K = 2 optimizer steps, one mini-batch per step, checkpoint and
  validation at step 2, then a second process resumes and runs step 3. The refresh at step 2 sets the reference to
  the policy that then samples step 3 (π_old), so at step 3 verl's own KL-loss metric (k3 against `ref_log_prob`) and
  the periodic reference's KL are ~0 — only if the resumed run restored the *refreshed* reference on both ranks
  (the initial model would give a clearly positive KL, as step 2 shows) — and the schedule continues (refresh count
  1, no refresh at step 3); the adaptive β (`kl_control=adaptive`) follows its recurrence on the all-reduced KL
  and the resumed step 3 uses exactly the β the first run computed after step 2;
* schedule-free AdamW with the iterative RPG loss and its KL active (2 mini-batches per step): validation before
  training and at step 2, a checkpoint with the HF export at step 2. Each rollout replica gets the iterate y after
  every update and the average x around validation (the servers' weight pushes: steps 0, 1, 2, 2, 2 per replica);
  rollout and π_old agree (`training/rollout_probs_diff_mean` ~ 0); the KL to π_old is non-zero; both ranks wrote
  their checkpoint shards with the optimizer in train mode (y), and the HF export is the average x, bit for bit.

Cost: three trainer start-ups, ~5 min on 2 cores. Needs artifacts/tiny.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
import torch
from cpu_trainer import check_steps, run_cpu_recipe

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)

SIZES = dict(CPU_RANKS="2", CPU_BATCH="4", CPU_N="4", CPU_SEED="0")  # 16 sequences per step, 8 per rank
SMALL_VAL = ["data.val_max_samples=32"]
BETA_TARGET, BETA_H = 1e-4, 2.0  # the adaptive β (docs/losses.md#adaptive-beta) on the periodic run
ADAPTIVE_BETA = ["+actor_rollout_ref.actor.policy_loss.kl_control=adaptive",
                 f"+actor_rollout_ref.actor.policy_loss.kl_target={BETA_TARGET}",
                 f"+actor_rollout_ref.actor.policy_loss.kl_horizon={BETA_H}"]  # fmt: skip  # validation on 32 of the 200 held-out prompts: only its steps are checked


def test_periodic_reference_checkpoint_and_resume_on_two_ranks(tiny_dir, tmp_path):
    overrides = [
        *SMALL_VAL, "trainer.val_before_train=False", "trainer.save_freq=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # 2 micro-batches per rank
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.policy_loss.reference=periodic",
        "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=2",
        *ADAPTIVE_BETA,
    ]
    first, text = run_cpu_recipe(tmp_path, "periodic_2r", [*overrides, "trainer.resume_mode=disable"],
                                 timeout_s=900, CPU_STEPS="2", CPU_TEST_FREQ="2", **SIZES)  # fmt: skip
    train = check_steps(first, text, [1, 2])
    assert any(k.startswith("val-core/") for k in train[2]), "no validation at step 2"
    assert [train[s]["actor/rpg/ref_refreshed"] for s in (1, 2)] == [0, 1]
    assert [train[s]["actor/rpg/ref_refresh_count"] for s in (1, 2)] == [0, 1]
    assert all("timing_s/ref" in train[s] for s in (1, 2)), "verl's reference forward must run at every step"
    assert train[2]["actor/kl_loss"] > 1e-6 and train[2]["actor/rpg/ref_kl"] > 1e-6  # reference = initial model
    assert "[rpg.reference] reference <- policy at training step 2" in text
    ckpt = tmp_path / "ckpts" / "global_step_2" / "actor"
    assert {f"model_world_size_2_rank_{r}.pt" for r in (0, 1)} <= {p.name for p in ckpt.iterdir()}
    assert (ckpt / "rpg_reference" / "ref_model").is_dir()

    second, text = run_cpu_recipe(tmp_path, "periodic_2r_resumed", [*overrides, "trainer.resume_mode=auto"],
                               timeout_s=900, CPU_STEPS="3", CPU_TEST_FREQ="2", **SIZES)  # fmt: skip
    s3 = check_steps(second, text, [3])[3]
    assert s3["actor/rpg/ref_refresh_count"] == 1 and s3["actor/rpg/ref_refreshed"] == 0, s3
    assert "timing_s/ref" in s3
    # the resumed reference is the step-2 policy on both ranks: zero KL on the on-policy step 3
    assert abs(s3["actor/kl_loss"]) < 1e-6 and abs(s3["actor/rpg/ref_kl"]) < 1e-6, s3
    # the adaptive β rides on this run: it follows its recurrence, and the resumed run continues it exactly
    for step, nxt in ((1, train[2]), (2, s3)):
        kl, beta = train[step]["actor/rpg/kl_ctrl_kl"], train[step]["actor/rpg/kl_coef"]
        assert train[step]["actor/rpg/kl_coef_next"] == beta * (1 + min(max(kl / BETA_TARGET - 1, -0.2), 0.2) / BETA_H)
        assert nxt["actor/rpg/kl_coef"] == train[step]["actor/rpg/kl_coef_next"], (step, nxt["actor/rpg/kl_coef"])
    assert len({train[1]["actor/rpg/kl_coef"], train[2]["actor/rpg/kl_coef"], s3["actor/rpg/kl_coef"]}) == 3


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


def assert_hf_export_is_x(ckpt, world_size: int) -> None:
    """The checkpoint holds y and a train-mode optimizer (k = 2 steps × 2 mini-batches), and its `huggingface/` export
    is the average x = lerp(y, z, 1 - 1/β1) (schedulefree's eval()), bit for bit, reassembled from the ranks' FSDP2
    shards (dim 0); and x ≠ y somewhere (else the export could not be told from the training iterate)."""
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
    assert differs, "x == y everywhere: the HF export cannot be distinguished from the training iterate"
