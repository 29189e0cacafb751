"""Periodic reference through verl's real fused worker (rpg/reference/): refresh, metrics, checkpoint/resume.

verl's `ActorRolloutRefWorker` (role `actor_rollout_ref`: FSDP2 actor + reference engine in one process, fp32) is built
in-process under the CPU platform (`rpg.cpu.platform`, rollout backend `hf`) with a tiny random Qwen2. Each training
step is what verl's trainer does: `compute_log_prob` (π_old) → `compute_ref_log_prob` (π_ref) → `update_actor` with
2 mini-batches (2 optimizer steps). With K = 3 optimizer steps the reference must be refreshed at the end of training
steps 2, 4, 6 (first step boundary with ≥ K steps since the last refresh) and nowhere else; after a refresh the
reference engine's weights and log-probs equal the actor's. A checkpoint taken at step 3 and resumed in a fresh worker
must continue with the same reference weights and refresh at the same steps as the uninterrupted run. About 30 s.
"""

import os

import pytest
import torch


K = 3
BATCH, MINI_BATCH = 4, 2  # -> 2 optimizer steps per training step
PROMPTS = [[5, 6, 7, 9], [11, 9], [3, 4, 5, 6, 7, 8, 9], [20, 21, 22]]


@pytest.fixture(scope="module")
def make_worker(tiny_qwen2_dir):
    from cpu_worker import fused_worker_builder

    from rpg import install

    return fused_worker_builder(tiny_qwen2_dir, [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MINI_BATCH}",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
        "+actor_rollout_ref.actor.policy_loss.reference=periodic",
        f"+actor_rollout_ref.actor.policy_loss.ref_refresh_steps={K}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=1",
    ], installs=(install.REF_LOG_PROB, install.WORKER_HOOKS))  # fmt: skip


def batch(step):
    """Training batch of step `step`: fixed prompts, responses drawn from a per-step seed (no rollout needed)."""
    from cpu_worker import token_batch

    g = torch.Generator().manual_seed(1000 + step)
    responses = [torch.randint(3, 48, (int(n),), generator=g).tolist() for n in torch.randint(1, 6, (BATCH,),
                                                                                               generator=g)]
    return token_batch(PROMPTS, responses, [1.0, -1.0, 0.5, -0.5])


def log_probs(worker, td, ref):
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    out = worker.compute_ref_log_prob(td.clone()) if ref else worker.compute_log_prob(td.clone())
    return no_padding_2_padding(tu.get(out, "log_probs"), td).detach()


def train_step(worker, step):
    """One verl training step on `batch(step)`; returns the metrics of update_actor and the batch."""
    from verl.utils import tensordict_utils as tu

    td, mask = batch(step)
    old, ref = log_probs(worker, td, ref=False), log_probs(worker, td, ref=True)
    td["old_log_probs"], td["ref_log_prob"] = old * mask, ref * mask
    tu.assign_non_tensor(td, compute_loss=True, global_batch_size=MINI_BATCH, mini_batch_size=MINI_BATCH, epochs=1,
                         seed=0, dataloader_kwargs={"shuffle": False})
    out = worker.update_actor(td)
    metrics = {k: v[0] if isinstance(v, list) else v for k, v in tu.get(out, "metrics").items()}
    return metrics, td, mask


def params(worker, which):
    from rpg.reference.weights import engine_module as _engine_module

    module = _engine_module(getattr(worker, which), which)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in module.state_dict().items()}


def same(a, b, atol=0.0):
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


def test_refresh_schedule_weights_checkpoint_and_resume(make_worker, tmp_path):
    worker = make_worker()
    initial = params(worker, "ref")
    assert same(initial, params(worker, "actor"))

    refreshed, ckpt = [], str(tmp_path / "global_step_3" / "actor")
    for step in range(1, 7):
        metrics, td, mask = train_step(worker, step)
        assert metrics["actor/rpg/ref_refresh_count"] == len(refreshed) + metrics["actor/rpg/ref_refreshed"]
        assert metrics["actor/rpg/ref_kl"] > 0  # the actor moved during the step, the reference did not
        if metrics["actor/rpg/ref_refreshed"]:
            refreshed.append(step)
            # π_ref ← π_θ: identical weights and identical log-probs through verl's reference path
            assert same(params(worker, "ref"), params(worker, "actor"))
            torch.testing.assert_close(log_probs(worker, td, ref=True) * mask, log_probs(worker, td, ref=False) * mask,
                                       rtol=0, atol=1e-6)
        elif step == 1:
            assert same(params(worker, "ref"), initial)  # untouched until the first refresh
            assert not same(params(worker, "actor"), initial)
        if step == 3:
            saved_ref = params(worker, "ref")
            worker.save_checkpoint(ckpt, global_step=3)
            saved_schedule = worker._rpg_reference.schedule.state_dict()
    assert refreshed == [2, 4, 6]
    history = worker._rpg_reference.schedule.state.history
    assert [(h["train_step"], h["optimizer_step"], h["reason"]) for h in history] == [(2, 4, "steps"), (4, 8, "steps"),
                                                                                       (6, 12, "steps")]
    assert os.path.exists(os.path.join(ckpt, "rpg_reference", "state.json"))
    assert not [f for f in os.listdir(os.path.join(ckpt, "rpg_reference")) if "tmp" in f]  # atomic writes left no temp

    resumed = make_worker()
    assert same(params(resumed, "ref"), initial)
    resumed.load_checkpoint(ckpt)
    assert resumed._rpg_reference.schedule.state_dict() == saved_schedule
    assert same(params(resumed, "ref"), saved_ref)  # the refreshed reference of step 2, not the initial model
    assert not same(saved_ref, initial)
    resumed_refreshes = []
    for step in range(4, 7):
        metrics, _, _ = train_step(resumed, step)
        if metrics["actor/rpg/ref_refreshed"]:
            resumed_refreshes.append(step)
    assert resumed_refreshes == [4, 6]
    assert resumed._rpg_reference.schedule.state_dict() == worker._rpg_reference.schedule.state_dict()
    assert same(params(resumed, "ref"), params(worker, "ref"), atol=1e-6)
