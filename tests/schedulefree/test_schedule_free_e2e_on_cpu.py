"""End to end on CPU with OPTIM=schedulefree: verl 0.9.1's trainer through the project launcher, 2 steps of
RPG-REINFORCE-URKL on the tiny model (recipe/rpg/cpu/run_rpg_reinforce_urkl.sh) with validation before training and
after step 2 and a checkpoint (with the HF export) at step 2. Two mini-batches per step, so x ≠ y from step 2 on.

Checks (rpg/schedule_free.py; docs/differences.md#d16):
* rollouts and π_old are the same iterate y: `training/rollout_probs_diff_mean` ≈ 0 at both steps (the rollout's
  log-probs of the sampled tokens vs the actor's old_log_prob; the authors' x-vs-y mix makes this large at step 2);
* validation ran with the average x: the rollout server received the weights three times at step 2 (after the
  update: y; before validation: x; after validation: y); before training x == y, so nothing extra was pushed;
* the checkpoint holds y and a train-mode optimizer state, and its `huggingface/` export is x computed from them.

Cost: one trainer start-up + 2 steps, about 2-3 minutes on 2 shared cores (artifacts/tiny is built once if missing).
"""

from __future__ import annotations

import re

import pytest
import torch
from cpu_trainer import run_cpu_recipe, training_steps

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)


@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sf_e2e")
    extra = ["data.val_max_samples=32",  # validation on 32 of the 200 held-out prompts: only its steps are checked
             "trainer.val_before_train=True", "trainer.save_freq=2", "trainer.resume_mode=disable",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 optimizer steps per RL step (8 responses each)
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
             "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]
    records, text = run_cpu_recipe(tmp, "sf_e2e", extra, timeout_s=900, OPTIM="schedulefree", CPU_STEPS="2",
                                   CPU_BATCH="4", CPU_N="4", CPU_TEST_FREQ="2", CPU_SEED="0")
    return {"records": records, "console": text, "ckpt": tmp / "ckpts" / "global_step_2" / "actor"}


def test_rollout_and_old_log_prob_are_the_same_iterate(run):
    train = training_steps(run["records"])
    assert sorted(train) == [1, 2]
    for step, data in train.items():
        assert abs(data["training/rollout_probs_diff_mean"]) < 1e-4, (step, data["training/rollout_probs_diff_mean"])


def test_validation_samples_the_average_and_training_resumes_with_y(run):
    val_steps = sorted(r["step"] for r in run["records"] if any(k.startswith("val-core/") for k in r["data"]))
    assert val_steps == [0, 2]
    pushes = re.findall(r"weights <- step (\d+)", run["console"])
    # step 0: initial sync only (x == y before any optimizer step); step 1: after the update;
    # step 2: after the update (y), before validation (x), after validation (y)
    assert pushes == ["0", "1", "2", "2", "2"], pushes


def test_checkpoint_is_y_and_hf_export_is_x(run):
    from safetensors.torch import load_file

    ckpt = run["ckpt"]
    model = torch.load(ckpt / "model_world_size_1_rank_0.pt", weights_only=False)
    optim = torch.load(ckpt / "optim_world_size_1_rank_0.pt", weights_only=False)
    group = optim["param_groups"][0]
    assert group["train_mode"] is True and group["k"] == 4  # 2 steps × 2 mini-batches
    beta1 = group["betas"][0]
    # optimizer state is indexed in parameter order = state_dict order without the (last, tied) lm_head
    names = [n for n in model if not n.endswith("lm_head.weight")]
    ids = {n: i for i, n in enumerate(names)}
    hf = load_file(ckpt / "huggingface" / "model.safetensors")
    differs, compared = False, 0
    for name in names:
        y = model[name].to_local() if hasattr(model[name], "to_local") else model[name]
        state = optim["state"].get(ids[name])
        if state is None or name not in hf:
            continue
        z = state["z"].to_local() if hasattr(state["z"], "to_local") else state["z"]
        x = torch.lerp(y, z, 1 - 1 / beta1)  # schedulefree's eval()
        torch.testing.assert_close(hf[name].float(), x.to(hf[name].dtype).float(), rtol=0, atol=0)
        differs |= not torch.equal(x.to(hf[name].dtype), y.to(hf[name].dtype))
        compared += 1
    assert compared >= len(names) - 1, (compared, len(names))
    assert differs, "x == y everywhere: the HF export cannot be distinguished from the training iterate"
