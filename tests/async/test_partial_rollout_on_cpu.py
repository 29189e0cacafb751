"""Partial rollouts on the CPU path: the `hf` server's abort/resume (rpg/cpu/hf_rollout.py) and the sampler that the
CPU profile's custom-sampler setting builds for the asynchronous trainer modes (rpg/cpu/sampler.py).

verl's colocate_async trainer aborts every replica after sampling a batch (`abort_all_requests`), trains, pushes the
new weights and reopens the replicas (`resume_generation`); its `FullyAsyncLLMServerClient` resubmits each aborted
request as prompt + partial response with the remaining token budget (docs/async.md#modes). The server is driven
in-process (no Ray), as in tests/cpu/test_hf_rollout_on_cpu.py. A few seconds.
"""

import asyncio
import threading

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

from rpg.cpu.hf_rollout import HFRolloutServer
from rpg.cpu.sampler import FastPollReplayBuffer, FastPollReplayBufferAsync

PROMPTS = [[5, 6, 7, 9], [11, 9], [3, 4, 5, 6, 7, 8, 9], [20, 21, 22]]
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "ignore_eos": True}
LENGTH = 20


def make_server(path):
    return HFRolloutServer({"prompt_length": 16, "response_length": LENGTH, "seed": 3}, {"path": path})


class PausingForward:
    """Wraps the server model: the `pause_at`-th forward call (1 = prefill, k = the call producing token k) blocks
    until `release` is set, so a test can abort at a known token."""

    def __init__(self, model, pause_at: int):
        self.model, self.pause_at, self.calls = model, pause_at, 0
        self.reached, self.release = threading.Event(), threading.Event()
        self.forward = model.forward

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.pause_at:
            self.reached.set()
            self.release.wait(10)
        return self.forward(*args, **kwargs)


async def _wait(predicate, what, timeout=10.0):
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def run_all(server, prompts, params=GREEDY):
    """Send the prompts concurrently (as verl's agent loop does); the TokenOutputs in order."""

    async def go():
        return await asyncio.gather(*[server.generate(p, dict(params), f"r{i}") for i, p in enumerate(prompts)])

    return asyncio.run(go())


def teacher_forced(model, prompt, response):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_abort_returns_partial_responses_and_resume_continues_under_new_weights(tiny_qwen2_dir):
    server = make_server(tiny_qwen2_dir)
    reference = make_server(tiny_qwen2_dir)  # the uninterrupted decode under the start weights
    full = run_all(reference, PROMPTS)
    hook = PausingForward(server.model, pause_at=5)
    server.model.forward = hook

    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in server.model.state_dict().items()}

    async def scenario():
        first = [asyncio.ensure_future(server.generate(p, dict(GREEDY), f"q{i}")) for i, p in enumerate(PROMPTS)]
        await _wait(hook.reached.is_set, "the 5th decode step")
        abort = asyncio.ensure_future(server.abort_all_requests())
        await _wait(lambda: server._stop.is_set(), "the abort signal")
        hook.release.set()
        aborted = await abort
        partial = await asyncio.gather(*first)
        # the gate is closed: a request (the client's resubmission) waits for resume_generation
        late = asyncio.ensure_future(server.generate(PROMPTS[0] + partial[0].token_ids,
                                                     dict(GREEDY, max_tokens=LENGTH - 5), "q0-resume"))
        await asyncio.sleep(0.2)
        assert not late.done(), "a request behind the closed gate was served before resume_generation"
        await server.update_weights(new_state, global_steps=1)
        await server.resume_generation()
        return aborted, partial, await late

    aborted, partial, resumed = asyncio.run(scenario())
    assert aborted["aborted_count"] == len(PROMPTS)
    for out, ref in zip(partial, full):
        assert out.stop_reason == "aborted" and out.extra_fields["global_steps"] == 0
        assert out.token_ids == ref.token_ids[:5]  # exactly the tokens decoded before the abort, from version 0
        torch.testing.assert_close(torch.tensor(out.log_probs), torch.tensor(ref.log_probs[:5]))
    # the continuation is sampled by the new weights and tagged with their version
    assert resumed.stop_reason == "completed" and resumed.extra_fields["global_steps"] == 1
    assert len(resumed.token_ids) == LENGTH - 5
    prefix = PROMPTS[0] + partial[0].token_ids
    server.model.forward = hook.forward
    torch.testing.assert_close(torch.tensor(resumed.log_probs), teacher_forced(server.model, prefix, resumed.token_ids),
                               atol=1e-5, rtol=1e-5)
    stale = teacher_forced(reference.model, prefix, resumed.token_ids)  # the start weights on the same tokens
    assert (torch.tensor(resumed.log_probs) - stale).abs().max() > 1e-3, "the continuation used the old weights"


def test_unchanged_weights_resume_to_the_uninterrupted_response(tiny_qwen2_dir):
    """Abort + resubmission (what FullyAsyncLLMServerClient does) without a weight change is invisible."""
    server, reference = make_server(tiny_qwen2_dir), make_server(tiny_qwen2_dir)
    full = asyncio.run(reference.generate(PROMPTS[2], dict(GREEDY), "r"))
    hook = PausingForward(server.model, pause_at=8)
    server.model.forward = hook

    async def scenario():
        first = asyncio.ensure_future(server.generate(PROMPTS[2], dict(GREEDY), "q"))
        await _wait(hook.reached.is_set, "the 8th decode step")
        abort = asyncio.ensure_future(server.abort_all_requests())
        await _wait(lambda: server._stop.is_set(), "the abort signal")
        hook.release.set()
        await abort
        part = await first
        await server.resume_generation()
        rest = await server.generate(PROMPTS[2] + part.token_ids, dict(GREEDY, max_tokens=LENGTH - len(part.token_ids)),
                                     "q-resume")
        return part, rest

    part, rest = asyncio.run(scenario())
    assert part.stop_reason == "aborted" and len(part.token_ids) == 8
    assert part.token_ids + rest.token_ids == full.token_ids
    torch.testing.assert_close(torch.tensor(part.log_probs + rest.log_probs), torch.tensor(full.log_probs),
                               atol=1e-5, rtol=1e-5)


def test_queued_requests_abort_empty_and_a_rejecting_gate_answers_at_once(tiny_qwen2_dir):
    server = make_server(tiny_qwen2_dir)

    async def scenario():
        server._window = 5.0  # requests stay queued: the batching window has not elapsed
        queued = asyncio.ensure_future(server.generate(PROMPTS[1], dict(GREEDY), "q"))
        await asyncio.sleep(0.05)
        aborted = await server.abort_all_requests(reject_request=True)
        out = await queued
        rejected = await asyncio.wait_for(server.generate(PROMPTS[1], dict(GREEDY), "late"), timeout=1.0)
        await server.resume_generation()
        server._window = 0.0
        served = await server.generate(PROMPTS[1], dict(GREEDY), "after")
        return aborted, out, rejected, served

    aborted, out, rejected, served = asyncio.run(scenario())
    assert aborted["aborted_count"] == 1
    assert (out.stop_reason, out.token_ids) == ("aborted", [])
    assert (rejected.stop_reason, rejected.token_ids) == ("aborted", [])
    assert served.stop_reason == "completed" and len(served.token_ids) == LENGTH


def test_sync_trainer_path_is_unchanged(tiny_qwen2_dir):
    """Without an abort nothing changes: every request completes, tagged with the current version."""
    server = make_server(tiny_qwen2_dir)
    outs = run_all(server, PROMPTS)
    assert all(o.stop_reason == "completed" and len(o.token_ids) == LENGTH for o in outs)
    assert {o.extra_fields["global_steps"] for o in outs} == {0}


# ---------------------------------------------------------------------------------------------------- sampler --
def make_sampler(mode, **sampler_kwargs):
    return FastPollReplayBuffer(trainer_mode=mode, trainer_config=OmegaConf.create({}), max_off_policy_threshold=4,
                                max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create(sampler_kwargs),
                                refill_fn=lambda *a, **k: None)


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_profile_sampler_setting_builds_verls_async_buffer_in_async_modes(mode):
    cfg = OmegaConf.create({
        "algorithm": {"filter_groups": {"enable": True, "metric": "acc"}},
        "data": {"train_batch_size": 16},
        "kw": {"poll_interval": 0.05, "filter_groups": "${algorithm.filter_groups}",
               "train_batch_size": "${data.train_batch_size}"},
    })
    buf = FastPollReplayBuffer(trainer_mode=mode, trainer_config=OmegaConf.create({}), max_off_policy_threshold=4,
                               max_off_policy_strategy="drop", sampler_kwargs=cfg.kw, refill_fn=lambda *a, **k: None)
    assert type(buf) is FastPollReplayBufferAsync and isinstance(buf, ReplayBufferAsync)
    assert (buf.trainer_mode, buf.poll_interval, buf.filter_groups_metric, buf.max_off_policy_threshold) == \
        (mode, 0.05, "acc", 4)
    assert hasattr(buf, "wait_for_sampleable") and hasattr(buf, "get_sampleable_count")  # separate_async's switch
    plain = make_sampler(mode, train_batch_size=8)
    assert type(plain) is FastPollReplayBufferAsync and plain.filter_groups_metric is None
    assert type(make_sampler("sync", train_batch_size=8)) is FastPollReplayBuffer


@pytest.mark.parametrize("kwargs, match", [
    ({"train_batch_size": 8, "poll": 1}, r"sampler_kwargs: unknown keys \['poll'\]"),
    ({"train_batch_size": 8, "filter_groups": {"enable": True, "metric": None}}, "metric"),
])
def test_async_sampler_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("colocate_async", **kwargs)


def test_async_sampler_refuses_the_sync_mode():
    with pytest.raises(ValueError, match="asynchronous trainer modes"):
        FastPollReplayBufferAsync(trainer_mode="sync", trainer_config=OmegaConf.create({}),
                                  max_off_policy_threshold=None, max_off_policy_strategy="drop",
                                  sampler_kwargs=OmegaConf.create({}), refill_fn=None)
