"""verl's real actor engine (FSDP2 on CPU, in-process) with schedule-free AdamW: parameter sets per role, exact ratio 1,
the validation switch and the checkpoint round-trip (rpg/schedule_free.py; docs/schedule-free.md;
docs/differences.md#d16).

One module-scoped worker walks through a schedule like the sync trainer's; each test checks one property.
A spy policy loss (registered here as "sf_spy") records the per-token ratio log π_θ − log π_old of every micro-batch.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import rpg.schedule_free as sfm
import rpg.schedule_free_worker as sfw
from rpg.shards import local_shard
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn, register_policy_loss

SPY_CALLS: list[torch.Tensor] = []

if "sf_spy" not in POLICY_LOSS_REGISTRY:

    @register_policy_loss("sf_spy")
    def _sf_spy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                     rollout_is_weights=None):
        SPY_CALLS.append((log_prob.detach() - old_log_prob).masked_fill(~response_mask.bool(), 0.0).clone())
        return get_policy_loss_fn("vanilla")(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                             config, rollout_is_weights)


BATCH, PROMPT, RESPONSE, MINI, MICRO = 4, 6, 5, 2, 1  # 2 mini-batches (optimizer steps) per RL step


def _new_worker(model_dir: str) -> sfw.ScheduleFreeActorRolloutRefWorker:
    from cpu_worker import compose, one_rank_env

    one_rank_env()
    config = compose(model_dir, [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
        "actor_rollout_ref.actor.policy_loss.loss_mode=sf_spy",
        "actor_rollout_ref.actor.optim.optimizer_impl=schedulefree",
        "actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFree",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.optim.weight_decay=0.1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ])
    worker = sfw.ScheduleFreeActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    return worker


def _batch(seed: int, old_log_probs: torch.Tensor | None = None):
    """A fixed (B, P+R) left-padded-prompt / right-padded-response batch in verl's no-padding TensorDict format."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 48, (BATCH, PROMPT), generator=g)
    responses = torch.randint(3, 48, (BATCH, RESPONSE), generator=g)
    prompt_mask = torch.ones(BATCH, PROMPT, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    response_mask = torch.ones(BATCH, RESPONSE, dtype=torch.long)
    response_mask[1, 3:] = 0  # right padding
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tensors = {
        "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
        "position_ids": position_ids, "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "advantages": torch.linspace(-1.0, 1.0, BATCH)[:, None].expand(BATCH, RESPONSE).contiguous(),
        "old_log_probs": torch.zeros(BATCH, RESPONSE) if old_log_probs is None else old_log_probs,
    }
    td = left_right_2_no_padding(DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}).to_tensordict())
    tu.assign_non_tensor(td, temperature=1.0, calculate_entropy=False, compute_loss=False, global_batch_size=MINI,
                         mini_batch_size=MINI, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    return td


def _old_log_prob(worker, seed: int) -> torch.Tensor:
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    td = _batch(seed)
    out = worker.compute_log_prob(td)
    return no_padding_2_padding(tu.get(out, "log_probs"), td).float()


def _rl_step(worker, seed: int) -> torch.Tensor:
    """compute_log_prob (π_old) then update_actor on the same batch, as the trainer does. Returns the spy's ratios."""
    old = _old_log_prob(worker, seed)
    SPY_CALLS.clear()
    worker.update_actor(_batch(seed, old_log_probs=old))
    return list(SPY_CALLS)


def _rollout_weights(worker) -> dict[str, torch.Tensor]:
    """Exactly what `update_weights` pushes to the rollout servers."""
    gen, _ = worker.actor.engine.get_per_tensor_param()
    return {k: v.detach().clone() for k, v in gen}


def _params(worker) -> dict[str, torch.Tensor]:
    return {n: local_shard(p).detach().clone() for n, p in worker.actor.engine.module.named_parameters()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class ModeSpy:
    """Records the schedule-free optimizer's train()/eval() calls."""

    def __init__(self, optimizer):
        self.calls: list[str] = []
        for name in ("train", "eval"):
            orig = getattr(optimizer, name)

            def spy(*a, _orig=orig, _name=name, **k):
                self.calls.append(_name)
                return _orig(*a, **k)

            setattr(optimizer, name, spy)


@pytest.fixture(scope="module")
def cpu_engine_env():
    """The CPU platform (VERL_PLATFORM=cpu, VERL_ENGINE_DEVICE=cuda: verl's FSDP engine on CPU) and the one-rank
    variables `cpu_worker.one_rank_env` sets, for this module's tests only: every variable is restored afterwards,
    so nothing leaks into the rest of the session (it did from collection on when set at import time)."""
    from cpu_worker import ONE_RANK_ENV

    from rpg.cpu import platform as cpu_platform

    with pytest.MonkeyPatch.context() as mp:
        for key in ONE_RANK_ENV:  # recorded here so that the context restores what one_rank_env() overwrites
            if key in os.environ:
                mp.setenv(key, os.environ[key])
            else:  # setenv records the absence (a delenv of an absent variable records nothing), then delenv
                mp.setenv(key, "")
                mp.delenv(key)
        mp.setenv("VERL_PLATFORM", "cpu")
        mp.setenv("VERL_ENGINE_DEVICE", "cuda")
        cpu_platform.install()
        yield


@pytest.fixture(scope="module")
def run(cpu_engine_env, tiny_qwen2_dir, tmp_path_factory):
    """One actor worker taken through: step 1, validation window, step 2, checkpoint, step 3; state recorded."""
    worker = _new_worker(tiny_qwen2_dir)
    sf = worker._schedule_free
    rec = {"worker": worker, "model_dir": tiny_qwen2_dir, "optimizer_type": type(worker.actor.engine.optimizer)}
    rec["mode_after_init"] = sf.current
    rec["no_switch_before_first_step"] = (worker.set_schedule_free_weights(sfm.AVERAGE),
                                          worker.set_schedule_free_weights(sfm.ITERATE))
    rec["ratios_step1"] = _rl_step(worker, seed=1)

    # validation window, as ScheduleFreeSyncTrainer.on_validate_begin/end drive it
    spy = ModeSpy(worker.actor.engine.optimizer)
    y_before = _params(worker)
    rec["pushed_before_val"] = _rollout_weights(worker)
    rec["switched_to_x"] = worker.set_schedule_free_weights(sfm.AVERAGE)
    rec["pushed_for_val"] = _rollout_weights(worker)
    rec["logp_at_x"] = _old_log_prob(worker, seed=2)
    rec["x_params"] = _params(worker)
    rec["switched_to_y"] = worker.set_schedule_free_weights(sfm.ITERATE)
    rec["y_restored_exactly"] = _same(y_before, _params(worker))
    rec["pushed_after_val"] = _rollout_weights(worker)
    rec["logp_at_y"] = _old_log_prob(worker, seed=2)
    rec["optimizer_calls_in_window"] = list(spy.calls)
    rec["ratios_step2"] = _rl_step(worker, seed=2)
    rec["optimizer_calls_in_step"] = spy.calls[len(rec["optimizer_calls_in_window"]):]

    ckpt = str(tmp_path_factory.mktemp("sf_ckpt") / "global_step_2" / "actor")
    rec["ckpt"] = ckpt
    y2 = _params(worker)
    with sf.average():
        rec["x2_params"] = _params(worker)
        rec["x2_rollout"] = _rollout_weights(worker)
    worker.save_checkpoint(ckpt, global_step=2, max_ckpt_to_keep=1)
    rec["saved_paths"] = list(worker.actor.engine.checkpoint_manager.previous_saved_paths)
    rec["y_after_save"] = _same(y2, _params(worker)) and sf.current == sfm.ITERATE
    rec["y2"] = y2
    live = worker.actor.engine.optimizer.state_dict()  # references to the live tensors: copy before step 3
    rec["opt_state_2"] = {
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in live["param_groups"]],
        "state": {i: {k: local_shard(v).clone() for k, v in s.items()} for i, s in live["state"].items()},
    }
    rec["ratios_step3"] = _rl_step(worker, seed=3)
    rec["params_3"] = _params(worker)
    return rec


def test_actor_builds_adamw_schedule_free_from_hydra_in_train_mode(run):
    import schedulefree

    assert issubclass(run["optimizer_type"], schedulefree.AdamWScheduleFree)
    group = run["worker"].actor.engine.optimizer.param_groups[0]
    assert group["weight_decay"] == 0.1 and tuple(group["betas"]) == (0.9, 0.999) and group["warmup_steps"] == 0
    assert run["mode_after_init"] == sfm.ITERATE
    assert run["no_switch_before_first_step"] == (False, False)  # x == y before any step: nothing to re-sync


@pytest.mark.parametrize("step", ["ratios_step1", "ratios_step2", "ratios_step3"])
def test_ratio_is_exactly_one_on_first_micro_batch(run, step):
    ratios = run[step]
    assert len(ratios) == BATCH // MICRO  # 2 mini-batches × 2 micro-batches
    # before the step's first optimizer step the policy is π_old, the sampling policy: log-ratio exactly 0
    for i in range(MINI // MICRO):
        assert torch.count_nonzero(ratios[i]) == 0, f"log π_θ − log π_old on micro-batch {i}: {ratios[i]}"
    # after the first optimizer step (second mini-batch) the ratio moves: the spy can see a non-unit ratio
    assert all(torch.count_nonzero(r) > 0 for r in ratios[MINI // MICRO:])


def test_validation_pushes_average_then_iterate_exactly(run):
    assert run["switched_to_x"] and run["switched_to_y"]
    assert run["optimizer_calls_in_window"] == ["eval"]  # y back by exact copy, not schedulefree's inverse lerp
    assert run["y_restored_exactly"]
    before, val, after = run["pushed_before_val"], run["pushed_for_val"], run["pushed_after_val"]
    assert before.keys() == val.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)  # rollout gets y back bit-exactly
    assert any(not torch.equal(before[k], val[k]) for k in before)  # validation really samples a different set
    # the log-probs at x differ from those at y: computing π_old at x (authors' code) would break ratio 1
    assert (run["logp_at_x"] - run["logp_at_y"]).abs().max() > 1e-4


def test_training_never_toggles_optimizer_mode(run):
    assert run["optimizer_calls_in_step"] == []  # rollout weights, old_log_prob and update all at y


def test_checkpoint_holds_y_and_hf_export_holds_x(run):
    from safetensors.torch import load_file

    ckpt = run["ckpt"]
    assert run["saved_paths"] == [ckpt]  # registered once, so rotation cannot delete it
    assert run["y_after_save"]
    shards = torch.load(os.path.join(ckpt, "model_world_size_1_rank_0.pt"), weights_only=False)
    optim = torch.load(os.path.join(ckpt, "optim_world_size_1_rank_0.pt"), weights_only=False)
    assert all(g["train_mode"] for g in optim["param_groups"])
    # the resume check reads the same fact from verl's real FSDP2 shard (DTensors) without loading it
    assert sfm._saved_optimizer_is_schedule_free(os.path.join(ckpt, "optim_world_size_1_rank_0.pt")) is True
    y_saved = {k: local_shard(v) for k, v in shards.items() if k in run["y2"]}
    assert _same(run["y2"], y_saved)
    hf = load_file(os.path.join(ckpt, "huggingface", "model.safetensors"))
    x = run["x2_rollout"]
    common = [k for k in hf if k in x]
    assert common
    for k in common:  # HF export is bf16 (verl's save dtype): compare to x rounded the same way
        assert torch.equal(hf[k].float(), x[k].to(hf[k].dtype).float()), k


def test_resume_continues_the_same_iterates(run):
    resumed = _new_worker(run["model_dir"])
    resumed.load_checkpoint(run["ckpt"], del_local_after_load=False)
    assert resumed._schedule_free.current == sfm.ITERATE
    assert _same(run["y2"], _params(resumed))
    state = resumed.actor.engine.optimizer.state_dict()
    ref = run["opt_state_2"]
    assert state["param_groups"][0]["k"] == ref["param_groups"][0]["k"] == 2 * MINI  # 2 RL steps × 2 mini-batches
    for key in ("weight_sum", "lr_max", "train_mode"):
        assert state["param_groups"][0][key] == ref["param_groups"][0][key], key
    for i, s in ref["state"].items():
        for name in ("z", "exp_avg_sq"):
            assert torch.equal(local_shard(state["state"][i][name]), local_shard(s[name])), (i, name)
    ratios = _rl_step(resumed, seed=3)
    assert torch.count_nonzero(ratios[0]) == 0
    assert _same(run["params_3"], _params(resumed))  # bit-exact continuation of the uninterrupted run
