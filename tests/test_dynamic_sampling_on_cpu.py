"""Bounded dynamic sampling (rpg/dynamic_sampling.py): the bound on the prompts a step draws, the round lines, the stop
message and the launch check, at the unit level (the trainer run on unmatchable data: tests/e2e/
test_e2e_trainer_on_cpu.py, its failing cluster job)."""

import inspect
import re
from collections import Counter

import pytest
from omegaconf import OmegaConf

import rpg.cpu.sampler
import rpg.dynamic_sampling
from rpg import replay_buffer
from rpg.dynamic_sampling import (
    BOUND_KEY,
    BoundedReplayBuffer,
    BoundedReplayBufferAsync,
    DrawCount,
    NO_SIGNAL_KEY,
    NO_SIGNAL_ROUNDS,
    DynamicSamplingExhausted,
    DynamicSamplingNoSignal,
    SamplerOptions,
    check_config,
)

FILTER = {"enable": True, "metric": "acc", "max_inflight_gen_batches": 3, "max_num_gen_batches": 2}


def options(**fg) -> SamplerOptions:
    return SamplerOptions.parse({"filter_groups": {**FILTER, **fg}, "train_batch_size": 4})


def buffer(mode="sync", **fg):
    drawn = []
    kwargs = OmegaConf.create({"filter_groups": {**FILTER, **fg}, "train_batch_size": 4})
    buf = BoundedReplayBuffer(
        trainer_mode=mode,
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        refill_fn=lambda n: drawn.append(n) or n,
        sampler_kwargs=kwargs,
    )
    return buf, drawn


def test_options_come_from_the_interpolated_trainer_settings():
    kw = {"filter_groups": "${algorithm.filter_groups}", "train_batch_size": "${data.train_batch_size}"}
    cfg = OmegaConf.create({"algorithm": {"filter_groups": FILTER}, "data": {"train_batch_size": 16}, "kw": kw})
    o = SamplerOptions.parse(cfg.kw)
    assert (o.metric, o.train_batch_size, o.gen_batch, o.limit) == ("acc", 16, 48, 96)
    assert options(max_num_gen_batches=0).limit is None  # 0: no bound (verl's behaviour)
    assert options(enable=False).limit is None and options(enable=False).metric is None


BAD_KWARGS = [
    ({"train_batch_size": 4, "bound": 1}, "unknown keys"),
    ({}, "train_batch_size"),
    ({"train_batch_size": 4, "filter_groups": {"enable": True, "metric": None}}, "metric must be set"),
]


@pytest.mark.parametrize("kwargs, match", BAD_KWARGS)
def test_bad_sampler_kwargs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplerOptions.parse(kwargs)


def test_a_step_draws_at_most_the_bound_its_own_batch_included():
    count = DrawCount(options())  # bound 2 × 3 × 4 = 24 prompts
    count.begin(step=1, need=4)
    assert count.drawn == 4 and not count.exhausted  # the trainer drew the step's batch
    assert [count.grant(8), count.grant(8), count.grant(8)] == [8, 8, 4]
    assert count.exhausted and count.grant(1) == 0 and count.drawn == 24
    count.begin(step=1, need=2)  # a second sample call of the same step (separate_async mini-batches): no reset
    assert count.drawn == 24
    count.begin(step=2, need=4)
    assert count.drawn == 4 and count.finished == 0
    unbounded = DrawCount(options(max_num_gen_batches=0))
    unbounded.begin(1, 4)
    assert unbounded.grant(10**6) == 10**6 and not unbounded.exhausted


def test_round_lines_report_the_fraction_kept():
    count = DrawCount(options())
    count.begin(step=3, need=4)
    assert count.record(kept=1, filtered=Counter({0.0: 2})) is None  # 3 of a round of 4 finished
    line = count.record(kept=1, filtered=Counter())
    want = f"[rpg.dynamic_sampling] step 3 round 1: 2 of 4 groups kept (50%); 4 prompts drawn of at most 24"
    assert line == f"{want} ({BOUND_KEY}=2)"
    assert count.record(kept=0, filtered=Counter({1.0: 5})).startswith("[rpg.dynamic_sampling] step 3 round 2: 0 of 5")
    assert "2 of 9 finished groups kept (22%)" in count.summary()
    metrics = {"training/filter_groups/kept_fraction": 2 / 9, "training/filter_groups/drawn_prompts": 4.0}
    assert count.metrics() == metrics


def test_the_stop_message_names_the_causes_and_the_setting():
    count = DrawCount(options())
    count.begin(step=1, need=4)
    count.grant(20)
    count.record(kept=0, filtered=Counter({0.0: 24}))
    msg = count.exhausted_message()
    parts = ["training step 1", "drew 24 prompts", f"{BOUND_KEY}=2", "3 × 4 prompts", "only 0 of the 4 groups"]
    parts += ["(acc = 0 in 24)", "chat template", "answer format", "response length", "max_response_length"]
    for part in parts + ["algorithm.filter_groups.enable=False"]:
        assert part in msg, (part, msg)
    assert "too easy" not in msg
    easy = DrawCount(options())
    easy.begin(1, 4)
    easy.record(kept=0, filtered=Counter({1.0: 4}))
    assert "too easy" in easy.exhausted_message() and "chat template" not in easy.exhausted_message()


def test_the_buffer_stops_when_the_bound_is_spent_and_nothing_is_in_flight():
    buf, drawn = buffer()
    assert (buf.filter_groups_metric, buf.gen_batch_size, buf.max_inflight_gen_batches) == ("acc", 1, 3)
    buf.count.begin(step=1, need=4)
    buf.running_keys["train"] = {"uid-a"}
    assert buf.refill_fn(30) == 20 and drawn == [20]  # capped at the bound
    assert buf.refill_fn(8) == 0 and drawn == [20]  # spent, a group still running: wait for it
    buf.running_keys["train"] = set()
    with pytest.raises(DynamicSamplingExhausted, match="dynamic sampling stopped at training step 1"):
        buf._wait_for_next_poll("train", 0.0)  # spent, nothing in flight, batch not full
    with pytest.raises(DynamicSamplingExhausted):
        buf.refill_fn(8)


def test_rounds_that_keep_no_group_stop_the_step_before_the_bound():
    count = DrawCount(options(max_num_gen_batches=20))  # bound 240 prompts
    count.begin(step=1, need=4)
    for r in range(1, NO_SIGNAL_ROUNDS + 1):
        assert not count.no_signal
        assert count.record(kept=0, filtered=Counter({0.0: 4})).startswith(f"[rpg.dynamic_sampling] step 1 round {r}")
    assert NO_SIGNAL_ROUNDS == 3 and count.no_signal and not count.exhausted
    msg = count.no_signal_message()
    head = "training step 1: no signal at all, the first 3 rounds (12 finished groups"
    for part in (head, "(acc = 0 in 12)", f"{BOUND_KEY}=20", "chat template", "answer format", f"+{NO_SIGNAL_KEY}=0"):
        assert part in msg, (part, msg)
    kept_once = DrawCount(options(max_num_gen_batches=20))  # one kept group: only the bound stops the step
    kept_once.begin(step=1, need=4)
    kept_once.record(kept=1, filtered=Counter({0.0: 3}))
    for _ in range(10):
        kept_once.record(kept=0, filtered=Counter({0.0: 4}))
    assert kept_once.rounds == 11 and not kept_once.no_signal
    opted_out = DrawCount(SamplerOptions.parse({"filter_groups": FILTER, "train_batch_size": 4, "max_empty_rounds": 0}))
    opted_out.begin(step=1, need=4)
    for _ in range(10):
        opted_out.record(kept=0, filtered=Counter({1.0: 4}))
    assert not opted_out.no_signal


def test_the_buffer_raises_the_no_signal_stop_from_its_round_line(monkeypatch):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    buf, _ = buffer()
    buf.count.begin(step=1, need=4)
    cache = buf._dapo_classification_cache["train"]
    monkeypatch.setattr(ReplayBuffer, "_dapo_filtered_keys", lambda self, pid: (set(cache), Counter()))
    for r in range(NO_SIGNAL_ROUNDS):
        cache.update({f"u{r}-{i}": 0.0 for i in range(4)})  # a round of 4 finished groups, every reward 0
        if r < NO_SIGNAL_ROUNDS - 1:
            buf._dapo_filtered_keys("train")
    with pytest.raises(DynamicSamplingNoSignal, match="no signal at all, the first 3 rounds"):
        buf._dapo_filtered_keys("train")
    assert issubclass(DynamicSamplingNoSignal, DynamicSamplingExhausted)  # rpg.launch prints it as a stop, not a crash


def test_every_trainer_mode_gets_a_bounded_buffer():
    for mode in ("colocate_async", "separate_async"):
        buf, drawn = buffer(mode)
        assert type(buf) is BoundedReplayBufferAsync and buf.filter_groups_metric == "acc"
        assert hasattr(buf, "wait_for_sampleable") and hasattr(buf, "get_sampleable_count")
        buf.count.begin(step=5, need=4)
        assert buf.refill_fn(100) == 20
    with pytest.raises(ValueError, match="asynchronous trainer modes"):
        BoundedReplayBufferAsync(
            trainer_mode="sync",
            trainer_config={},
            max_off_policy_threshold=None,
            max_off_policy_strategy="drop",
            refill_fn=None,
            sampler_kwargs={"train_batch_size": 4},
        )


def launch_config(custom=None, kwargs=None):
    base = {"path": "pkg://rpg.dynamic_sampling", "name": "BoundedReplayBuffer"}
    wired = {"filter_groups": "${algorithm.filter_groups}", "train_batch_size": "${data.train_batch_size}"}
    sampler = {"custom_sampler": {**base, **(custom or {})}, "sampler_kwargs": {**wired, **(kwargs or {})}}
    data = {"algorithm": {"filter_groups": FILTER}, "data": {"train_batch_size": 4}}
    return OmegaConf.create({**data, "trainer": {"v1": {"sampler": sampler}}})


def test_launch_refuses_a_bound_that_no_sampler_would_enforce():
    check_config(launch_config())
    check_config(launch_config(custom={"path": "pkg://rpg.cpu.sampler", "name": "FastPollReplayBuffer"}))
    with pytest.raises(ValueError, match=f"{BOUND_KEY}=2 is ignored by verl's built-in replay buffer"):
        check_config(launch_config(custom={"path": None, "name": None}))
    with pytest.raises(ValueError, match="sampler_kwargs.train_batch_size must equal data.train_batch_size"):
        check_config(launch_config(kwargs={"train_batch_size": 8}))
    off = launch_config(custom={"path": None, "name": None})
    off.algorithm.filter_groups.max_num_gen_batches = 0
    check_config(off)  # no bound asked for: verl's buffer is fine


# ---- the one adapter over verl's replay buffer (rpg/replay_buffer.py) ----------------------------------------------
def test_the_adapter_lists_every_private_member_the_samplers_use():
    """Every `self.<name>` of verl's buffer that rpg's samplers touch (the private methods they call or override and
    the state they read) is one of the adapter's checked names (or a public method of verl's buffer)."""
    listed = {name for _, name in replay_buffer.METHODS} | set(replay_buffer.STATE)
    verl_classes = (replay_buffer.ReplayBuffer, replay_buffer.ReplayBufferAsync)
    verl_state = {n for cls in verl_classes
                  for n in re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=", inspect.getsource(cls.__init__))}
    verl_members = set(dir(replay_buffer.ReplayBufferAsync)) | verl_state
    assert set(replay_buffer.STATE) <= verl_state
    samplers = [rpg.dynamic_sampling._BoundedDraws, BoundedReplayBuffer, BoundedReplayBufferAsync,
                rpg.cpu.sampler.FastPollReplayBuffer, rpg.cpu.sampler.FastPollReplayBufferAsync]
    for cls in samplers:
        used = set(re.findall(r"\bself\.(\w+)", inspect.getsource(cls))) & verl_members
        unlisted = {n for n in used if n.startswith("_") or n in verl_state} - listed
        assert not unlisted, (cls.__name__, sorted(unlisted))
    assert "_accumulate_eviction_metrics" not in inspect.getsource(rpg.cpu.sampler)  # through the adapter


def test_the_adapter_refuses_a_verl_whose_buffer_changed(monkeypatch):
    """The guard has teeth: a private method with other parameters, or a buffer without a state attribute, is
    named."""
    def renamed(self, partition, last_debug_time):  # verl renamed a parameter
        return 0.0

    monkeypatch.setattr(replay_buffer.ReplayBuffer, "_wait_for_next_poll", renamed)
    with pytest.raises(RuntimeError, match="_wait_for_next_poll"):
        replay_buffer.check()
    monkeypatch.undo()
    replay_buffer.check()  # verl 0.9.1's own buffer passes
    buf, _ = buffer()
    replay_buffer.check_buffer(buf)
    del buf._dapo_classification_cache
    with pytest.raises(RuntimeError, match="_dapo_classification_cache"):
        replay_buffer.check_buffer(buf)
