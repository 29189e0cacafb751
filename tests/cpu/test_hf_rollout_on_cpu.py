"""The "hf" CPU rollout backend (rpg/cpu/hf_rollout.py): sampling semantics, seeding, batching, weight sync.

The server is exercised in-process (no Ray): it is a plain class whose async ``generate`` is what verl's
``LLMServerClient`` calls. The actor-side check drives verl's real FSDP2 engine (``ActorRolloutRefWorker``) in-process
under the CPU platform: after an optimizer step the actor's weights (verl's own ``get_per_tensor_param`` generator)
go through ``HFServerAdapter``'s conversion into the server, and the rollout's log-probs must equal the actor's
``compute_log_prob`` on the same tokens. About 15 s in total.
"""

import asyncio
import os

import pytest
import torch
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry

from rpg.cpu.hf_rollout import HFReplica, HFRolloutServer, HFServerAdapter, SamplingSpec, process_logits

PROMPTS = [[5, 6, 7, 9], [11, 9], [3, 4, 5, 6, 7, 8, 9], [20, 21, 22]]
SAMPLE = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def make_server(path, seed=7, response_length=12, **kw):
    return HFRolloutServer({"prompt_length": 16, "response_length": response_length, "seed": seed}, {"path": path}, **kw)


def run(server, requests):
    """Send all requests concurrently (as verl's agent loop does) and return the TokenOutputs in order."""

    async def go():
        return await asyncio.gather(*[server.generate(p, dict(sp), f"req{i}") for i, (p, sp) in enumerate(requests)])

    return asyncio.run(go())


def teacher_forced_logprobs(model, prompt, response, temperature=1.0):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_registered_under_verl_extension_points():
    assert RolloutReplicaRegistry.get("hf") is HFReplica
    assert _ROLLOUT_REGISTRY[("hf", "async")] == "rpg.cpu.hf_rollout.HFServerAdapter"
    assert get_rollout_class("hf", "async") is HFServerAdapter


def test_greedy_is_argmax_and_independent_of_batching(tiny_qwen2_dir):
    server = make_server(tiny_qwen2_dir)
    batched = run(server, [(p, GREEDY) for p in PROMPTS])
    for prompt, out in zip(PROMPTS, batched):
        ids = prompt + out.token_ids
        with torch.no_grad():
            logits = server.model(torch.tensor([ids])).logits[0]
        argmax = logits[len(prompt) - 1: -1].argmax(-1).tolist()
        assert out.token_ids == argmax
        assert len(out.token_ids) == 12  # random model: eos never wins, so the length budget stops it
        assert out.extra_fields["global_steps"] == 0 and out.stop_reason == "completed"
    single = [run(server, [(p, GREEDY)])[0] for p in PROMPTS]
    assert [o.token_ids for o in single] == [o.token_ids for o in batched]


def test_sampled_logprobs_match_teacher_forcing(tiny_qwen2_dir):
    server = make_server(tiny_qwen2_dir)
    for temperature in (1.0, 0.7):
        outs = run(server, [(p, dict(SAMPLE, temperature=temperature)) for p in PROMPTS])
        for prompt, out in zip(PROMPTS, outs):
            ref = teacher_forced_logprobs(server.model, prompt, out.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(out.log_probs), ref, atol=1e-5, rtol=1e-5)
    assert server.stats["batches"] == 2  # 4 concurrent requests were served as one batch per call


def test_sampling_reproducible_under_seed(tiny_qwen2_dir):
    requests = [(p, SAMPLE) for p in PROMPTS] + [(PROMPTS[0], SAMPLE)] * 3
    a = [o.token_ids for o in run(make_server(tiny_qwen2_dir, seed=7), requests)]
    b = [o.token_ids for o in run(make_server(tiny_qwen2_dir, seed=7), requests)]
    c = [o.token_ids for o in run(make_server(tiny_qwen2_dir, seed=8), requests)]
    assert a == b
    assert a != c
    copies = [a[0], a[4], a[5], a[6]]  # n samples of one prompt must differ from each other
    assert len({tuple(x) for x in copies}) == len(copies)
    # the same seed gives the same samples whatever the micro-batch composition
    one_by_one_server = make_server(tiny_qwen2_dir, seed=7)
    one_by_one = [run(one_by_one_server, [r])[0].token_ids for r in requests]
    assert one_by_one == a


def test_samples_and_logprobs_do_not_depend_on_batching_or_arrival_order(tiny_qwen2_dir):
    """A run is reproducible only if a request's sample (and its log-probs, bit for bit) depends on its seed, prompt
    and occurrence, not on which requests share its micro-batch or arrive first."""
    requests = [(p, SAMPLE) for p in PROMPTS * 3] + [([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], SAMPLE)]

    def served(chunks):
        server, outs = make_server(tiny_qwen2_dir), {}
        for chunk in chunks:  # each chunk arrives together (one micro-batch); chunks one after another
            for i, out in zip(chunk, run(server, [requests[i] for i in chunk])):
                outs[i] = out
        by_prompt: dict[tuple, list] = {}
        for i in sorted(outs):
            by_prompt.setdefault(tuple(requests[i][0]), []).append((out := outs[i]).token_ids + out.log_probs)
        return {p: sorted(samples) for p, samples in by_prompt.items()}

    order = list(range(len(requests)))
    together = served([order])
    assert served([[i] for i in order]) == together
    assert served([order[::-1][k:k + 3] for k in range(0, len(order), 3)]) == together


def test_max_tokens_stop_tokens_and_eos(tiny_qwen2_dir):
    server = make_server(tiny_qwen2_dir)
    out = run(server, [(PROMPTS[0], dict(GREEDY, max_tokens=5))])[0]
    assert len(out.token_ids) == 5 and len(out.log_probs) == 5
    full = run(server, [(PROMPTS[0], GREEDY)])[0].token_ids
    stop_at = full[3]
    first = full.index(stop_at)
    stopped = run(server, [(PROMPTS[0], dict(GREEDY, stop_token_ids=[stop_at]))])[0].token_ids
    assert stopped == full[: first + 1]  # stop token included, as vLLM returns it
    eos_server = make_server(tiny_qwen2_dir)
    eos_server.eos_token_ids = (stop_at,)  # as if generation_config.eos_token_id were this token
    assert run(eos_server, [(PROMPTS[0], GREEDY)])[0].token_ids == full[: first + 1]
    assert run(eos_server, [(PROMPTS[0], dict(GREEDY, ignore_eos=True))])[0].token_ids == full
    # default budget: min(response_length, prompt_length + response_length - len(prompt))
    long_prompt = list(range(3, 3 + 14))
    assert len(run(make_server(tiny_qwen2_dir, response_length=12), [(long_prompt, GREEDY)])[0].token_ids) == 12
    no_lp = run(server, [(PROMPTS[1], dict(SAMPLE, logprobs=False))])[0]
    assert no_lp.log_probs is None


def test_top_k_top_p_filtering():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    topk = process_logits(logits, 1.0, top_k=2, top_p=1.0)
    assert torch.isfinite(topk[0, :2]).all() and torch.isinf(topk[0, 2:]).all()
    probs = torch.softmax(logits, -1)[0]  # 0.64, 0.24, 0.09, ...
    nucleus = process_logits(logits, 1.0, top_k=-1, top_p=float(probs[0] + probs[1]) - 1e-3)
    assert torch.isfinite(nucleus[0, :2]).all() and torch.isinf(nucleus[0, 2:]).all()
    scaled = process_logits(logits, 0.5, top_k=-1, top_p=1.0)
    torch.testing.assert_close(scaled, logits / 0.5)


def test_sampling_honours_top_k(tiny_qwen2_dir):
    server = make_server(tiny_qwen2_dir)
    prompt = PROMPTS[0]
    outs = run(server, [(prompt, dict(SAMPLE, top_k=1))])
    greedy = run(server, [(prompt, GREEDY)])
    assert outs[0].token_ids == greedy[0].token_ids  # top_k=1 sampling is argmax
    assert all(abs(lp) < 1e-6 for lp in outs[0].log_probs)  # processed log-probs: the only candidate has prob 1


@pytest.mark.parametrize("params, match", [
    ({"n": 2}, "n=2"), ({"best_of": 3}, "unsupported sampling params"), ({"repetition_penalty": 1.2}, "repetition"),
    ({"max_tokens": 0}, "max_tokens"), ({"top_p": 0.0}, "top_p"),
])
def test_bad_sampling_params_are_named(params, match):
    with pytest.raises(ValueError, match=match):
        SamplingSpec.from_request(params, prompt_len=4, prompt_length=16, response_length=8, eos_token_ids=[2])


def test_update_weights_changes_samples_and_rejects_wrong_names(tiny_qwen2_dir):
    server = make_server(tiny_qwen2_dir)
    before = run(server, [(PROMPTS[0], GREEDY)])[0]
    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in server.model.state_dict().items()}
    asyncio.run(server.update_weights(new_state, global_steps=3))
    after = run(server, [(PROMPTS[0], GREEDY)])[0]
    assert after.extra_fields["global_steps"] == 3
    assert after.token_ids != before.token_ids or after.log_probs != before.log_probs
    with pytest.raises(ValueError, match="unexpected"):
        asyncio.run(server.update_weights({**new_state, "not.a.weight": torch.zeros(1)}, global_steps=4))
    missing = dict(new_state)
    missing.pop("model.norm.weight")
    with pytest.raises(ValueError, match="missing"):
        asyncio.run(server.update_weights(missing, global_steps=4))


# ------------------------------------------------------------------------------------------------ real verl engine --
@pytest.fixture(scope="module")
def cpu_actor(tiny_qwen2_dir):
    """verl's ActorRolloutRefWorker (role 'actor', FSDP2 on CPU, fp32) built in-process under the CPU platform.

    The environment variables it needs are restored afterwards (so later subprocess-based tests do not inherit
    VERL_PLATFORM=cpu without the module that defines it), and the gloo process group is destroyed.
    """
    if os.environ.get("VERL_PLATFORM", "cpu") != "cpu":
        pytest.skip("VERL_PLATFORM is set to another platform")
    from cpu_worker import compose, one_rank_env, restore_env

    saved = one_rank_env()
    from verl.workers.engine_workers import ActorRolloutRefWorker

    try:
        cfg = compose(tiny_qwen2_dir, [
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.use_kl_loss=False",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=1", "trainer.n_gpus_per_node=1",
        ])  # fmt: skip
        worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
        worker.init_model()
        yield worker
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        restore_env(saved)


def _actor_batch(prompts, responses, extra=None, pad_id=0):
    """verl's padded batch (left-padded prompts, right-padded responses) as a no-padding TensorDict.

    ``extra`` maps names to (bs, response_len) tensors (e.g. old_log_probs, advantages), kept padded as verl does.
    """
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    plen, rlen = max(map(len, prompts)), max(map(len, responses))
    bsz = len(prompts)
    p_ids = torch.full((bsz, plen), pad_id)
    r_ids = torch.full((bsz, rlen), pad_id)
    p_mask, r_mask = torch.zeros(bsz, plen, dtype=torch.long), torch.zeros(bsz, rlen, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_ids[i, plen - len(p):], p_mask[i, plen - len(p):] = torch.tensor(p), 1
        r_ids[i, : len(r)], r_mask[i, : len(r)] = torch.tensor(r), 1
    mask = torch.cat([p_mask, r_mask], 1)
    tensors = {"input_ids": torch.cat([p_ids, r_ids], 1), "attention_mask": mask,
               "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "prompts": p_ids, "responses": r_ids,
               "response_mask": r_mask, **(extra or {})}
    td = left_right_2_no_padding(DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}).to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    return td, r_mask


def _padded_logprobs(outs, shape):
    padded = torch.zeros(shape)
    for i, o in enumerate(outs):
        padded[i, : len(o.log_probs)] = torch.tensor(o.log_probs)
    return padded


def _actor_logprobs(worker, prompts, responses):
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    td, r_mask = _actor_batch(prompts, responses)
    out = worker.compute_log_prob(td)
    return no_padding_2_padding(tu.get(out, "log_probs"), td), r_mask


def _ship_actor_weights(worker, server, step):
    """What HFServerAdapter.update_weights does, with the server object instead of a Ray actor handle."""
    adapter = HFServerAdapter.__new__(HFServerAdapter)
    adapter.is_leader, adapter._server = True, _Direct(server)
    params, peft_config = worker.actor.engine.get_per_tensor_param(layered_summon=False, base_sync_done=True)
    asyncio.run(adapter.update_weights(params, global_steps=step, peft_config=peft_config))


class _Direct:
    """Stands in for a Ray actor handle: ``handle.method.remote(...)`` calls the object's coroutine."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        return type("M", (), {"remote": staticmethod(getattr(self._obj, name))})


def test_rollout_logprobs_match_verl_actor_after_weight_update(cpu_actor, tiny_qwen2_dir):
    from verl.utils import tensordict_utils as tu

    server = make_server(tiny_qwen2_dir)
    outs = run(server, [(p, SAMPLE) for p in PROMPTS])
    responses = [o.token_ids for o in outs]
    # the actor (fp32 FSDP2) and the rollout start from the same checkpoint: same log-probs
    actor_lp, mask = _actor_logprobs(cpu_actor, PROMPTS, responses)
    rollout_lp = _padded_logprobs(outs, actor_lp.shape)
    assert ((actor_lp - rollout_lp) * mask).abs().max() < 1e-4

    # one optimizer step on the actor (verl's update_actor, vanilla PPO loss) moves it away from the rollout
    advantages = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand_as(rollout_lp).contiguous()
    td, _ = _actor_batch(PROMPTS, responses, {"old_log_probs": rollout_lp, "advantages": advantages})
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=True, global_batch_size=4, mini_batch_size=4,
                         epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    cpu_actor.update_actor(td)
    stale, _ = _actor_logprobs(cpu_actor, PROMPTS, responses)
    assert ((stale - rollout_lp) * mask).abs().max() > 1e-3

    # verl's weight generator -> adapter -> server; the rollout now samples the updated policy
    _ship_actor_weights(cpu_actor, server, step=1)
    fresh = run(server, [(p, SAMPLE) for p in PROMPTS])
    assert all(o.extra_fields["global_steps"] == 1 for o in fresh)
    actor_lp, mask = _actor_logprobs(cpu_actor, PROMPTS, [o.token_ids for o in fresh])
    rollout_lp = _padded_logprobs(fresh, actor_lp.shape)
    diff = ((actor_lp - rollout_lp) * mask).abs().max()
    assert diff < 1e-4, f"rollout vs actor log-prob mismatch after the weight update: {diff}"
