"""Bounded dynamic sampling: DAPO's group filter with a bound on the prompts one training step may draw.

With `algorithm.filter_groups` on, verl 0.9.1's v1 trainer keeps only the groups whose `filter_groups.metric` (`acc`)
varies across the group's responses and refills the others from the data loader until a batch is complete. Its
replay buffer ignores `filter_groups.max_num_gen_batches`: when no group varies (accuracy 0 everywhere: a wrong chat
template, an answer the scorer cannot read, responses cut before the answer; or 1 everywhere), it generates forever
without a word. The authors' trainer (DAPO's loop, generation batches of 3 × 512 prompts) stopped after
`max_num_gen_batches` = 20 generation batches with "Generated too many. Please check your data."

This module is verl's own replay buffer, installed through verl's hook for a custom sampler
(`trainer.v1.sampler.custom_sampler`, set in rpg/config/rpg_trainer.yaml), with three additions:

* the bound: a step may draw at most `max_num_gen_batches` generation batches of `max_inflight_gen_batches ×
  data.train_batch_size` prompts (the authors' generation batch: 3 × 512), the step's own batch included; refills
  beyond it are not drawn, and once the prompts drawn have all finished without enough kept groups the run stops
  with `DynamicSamplingExhausted`, whose message names the likely causes and the setting
  (`max_num_gen_batches` ≤ 0: no bound, verl's behaviour);
* no signal stops at once: when the first `max_empty_rounds` rounds of a step (default 3,
  `NO_SIGNAL_ROUNDS`) keep no group at all, every group's reward being equal, the run stops with
  `DynamicSamplingNoSignal` and the same diagnosis, long before the bound (20 generation batches of 3 rounds each);
  once a step keeps any group, `max_num_gen_batches` alone bounds it. Opt-out:
  `+trainer.v1.sampler.sampler_kwargs.max_empty_rounds=0`;
* a line per round (every `data.train_batch_size` finished groups) with the fraction of groups kept, and one per
  sampled batch; the metrics `training/filter_groups/kept_fraction` and `.../drawn_prompts`;
* the settings a custom sampler does not receive from verl (the group filter, the batch size) are read from
  `trainer.v1.sampler.sampler_kwargs`, wired by Hydra interpolation to the trainer's own keys.

verl's buffer has no public API for a custom sampler: the private members used here are listed and version-guarded
in `rpg.replay_buffer`, the one adapter over it. Every trainer mode is bounded: the sync trainer through
`BoundedReplayBuffer` (verl's `ReplayBuffer`), the asynchronous ones (`colocate_async`, `separate_async`) through
`BoundedReplayBufferAsync` (verl's `ReplayBufferAsync`, which refills each evicted group once);
`BoundedReplayBuffer(trainer_mode=...)` builds the right one. In every mode the prompts a step draws are its batch
plus the refills the buffer asks for while sampling that step. The CPU profile's `rpg.cpu.sampler` subclasses both. docs/differences.md#s7-5.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Optional

from rpg.replay_buffer import ReplayBuffer, ReplayBufferAsync, check_buffer, classification_cache, in_flight

from rpg import modes

SAMPLER_KWARGS = ("filter_groups", "train_batch_size", "poll_interval", "max_empty_rounds")
BOUND_KEY = "algorithm.filter_groups.max_num_gen_batches"
NO_SIGNAL_ROUNDS = 3  # rounds of data.train_batch_size finished groups, none kept, before a step stops (one
# generation batch of the recipes' 3 × 512 prompts; a handful of groups for the CPU recipes' batch of 4)
NO_SIGNAL_KEY = "trainer.v1.sampler.sampler_kwargs.max_empty_rounds"
TRAIN = "train"


class DynamicSamplingExhausted(RuntimeError):
    """A training step drew the most prompts `algorithm.filter_groups.max_num_gen_batches` allows, all of them
    finished, and too few groups had a varying reward to fill the batch."""


class DynamicSamplingNoSignal(DynamicSamplingExhausted):
    """The first `max_empty_rounds` rounds of a training step kept no group: every response of every group got the
    same reward, so no group carries a learning signal (stopped before the bound)."""


@dataclasses.dataclass(frozen=True)
class SamplerOptions:
    """What `trainer.v1.sampler.sampler_kwargs` tells a custom sampler (verl passes it nothing else)."""

    metric: Optional[str]  # filter_groups.metric when filtering is on, else None
    train_batch_size: int
    max_inflight_gen_batches: int
    max_num_gen_batches: int  # <= 0: no bound
    poll_interval: Optional[float]  # None: verl's default
    max_empty_rounds: int = NO_SIGNAL_ROUNDS  # <= 0: only the bound stops a step

    @classmethod
    def parse(cls, sampler_kwargs: Any) -> "SamplerOptions":
        opts = dict(sampler_kwargs or {})
        unknown = set(opts) - set(SAMPLER_KWARGS)
        if unknown:
            raise ValueError(
                f"trainer.v1.sampler.sampler_kwargs: unknown keys {sorted(unknown)}; valid: {list(SAMPLER_KWARGS)}"
            )
        if "train_batch_size" not in opts:
            raise ValueError(
                "trainer.v1.sampler.sampler_kwargs.train_batch_size is missing: set it to "
                "'${data.train_batch_size}' (rpg/config/rpg_trainer.yaml does)"
            )
        fg = opts.get("filter_groups") or {}
        enabled = bool(fg.get("enable", False))
        if enabled and not fg.get("metric"):
            raise ValueError("algorithm.filter_groups.metric must be set when group filtering is enabled")
        poll = opts.get("poll_interval")
        return cls(
            metric=str(fg["metric"]) if enabled else None,
            train_batch_size=int(opts["train_batch_size"]),
            max_inflight_gen_batches=int(fg.get("max_inflight_gen_batches", 1) or 1),
            max_num_gen_batches=int(fg.get("max_num_gen_batches", 0) or 0),
            poll_interval=None if poll is None else float(poll),
            max_empty_rounds=int(opts.get("max_empty_rounds", NO_SIGNAL_ROUNDS)),
        )

    @property
    def gen_batch(self) -> int:
        """Prompts of one generation batch: max_inflight_gen_batches × train_batch_size."""
        return self.max_inflight_gen_batches * self.train_batch_size

    @property
    def limit(self) -> Optional[int]:
        """Prompts a step may draw, its own batch included; None: no bound (no filtering, or max_num_gen_batches ≤
        0)."""
        if self.metric is None or self.max_num_gen_batches <= 0:
            return None
        return self.max_num_gen_batches * self.gen_batch

    def buffer_kwargs(self) -> dict:
        """verl's ReplayBuffer arguments, as `trainer_base._build_replay_buffer` sets them for its built-in buffer."""
        kwargs: dict = dict(filter_groups_metric=self.metric)
        if self.poll_interval is not None:
            kwargs["poll_interval"] = self.poll_interval
        return kwargs


@dataclasses.dataclass
class DrawCount:
    """One step's accounting: prompts drawn, groups finished and kept, the shared value of the filtered groups."""

    options: SamplerOptions
    step: Optional[int] = None
    need: int = 0  # groups the current sample call needs
    drawn: int = 0  # prompts drawn for the step: its batch (drawn by the trainer) + the buffer's refills
    finished: int = 0
    kept: int = 0
    filtered: Counter = dataclasses.field(default_factory=Counter)  # shared metric value -> groups
    rounds: int = 0
    _round_start: tuple[int, int] = (0, 0)  # (finished, kept) when the current round began

    def begin(self, step: int, need: int) -> None:
        if step != self.step:
            self.step, self.drawn, self.finished, self.kept, self.rounds = step, self.options.train_batch_size, 0, 0, 0
            self.filtered, self._round_start = Counter(), (0, 0)
        self.need = need

    def grant(self, n: int) -> int:
        """How many of `n` requested prompts may be drawn now (and count them as drawn)."""
        limit = self.options.limit
        granted = n if limit is None else max(0, min(n, limit - self.drawn))
        self.drawn += granted
        return granted

    @property
    def exhausted(self) -> bool:
        return self.options.limit is not None and self.drawn >= self.options.limit

    @property
    def no_signal(self) -> bool:
        """The step's first `max_empty_rounds` rounds finished and kept no group at all."""
        o = self.options
        return o.metric is not None and o.max_empty_rounds > 0 and self.kept == 0 and self.rounds >= o.max_empty_rounds

    def record(self, kept: int, filtered: Counter) -> Optional[str]:
        """Count newly finished groups; a round line when they complete a round (`data.train_batch_size` finished
        groups since the last line), with the groups kept since then."""
        self.finished += kept + sum(filtered.values())
        self.kept += kept
        self.filtered.update(filtered)
        finished, kept_since = self.finished - self._round_start[0], self.kept - self._round_start[1]
        if finished < self.options.train_batch_size:
            return None
        self.rounds, self._round_start = self.rounds + 1, (self.finished, self.kept)
        return (f"[rpg.dynamic_sampling] step {self.step} round {self.rounds}: {kept_since} of {finished} groups kept "
                f"({kept_since / finished:.0%}); {self.drawn} prompts drawn{self._of_limit()}")

    def _of_limit(self) -> str:
        limit = self.options.limit
        return f" of at most {limit} ({BOUND_KEY}={self.options.max_num_gen_batches})" if limit else ""

    def summary(self) -> str:
        frac = self.kept / self.finished if self.finished else 1.0
        return (f"[rpg.dynamic_sampling] step {self.step}: batch of {self.need} groups sampled; {self.kept} of "
                f"{self.finished} finished groups kept ({frac:.0%}); {self.drawn} prompts drawn{self._of_limit()}")

    def metrics(self) -> dict[str, float]:
        return {
            "training/filter_groups/kept_fraction": self.kept / self.finished if self.finished else 1.0,
            "training/filter_groups/drawn_prompts": float(self.drawn),
        }

    def _shared_values(self) -> str:
        return ", ".join(f"{self.options.metric} = {v:g} in {c}" for v, c in sorted(self.filtered.items()))

    def no_signal_message(self) -> str:
        o = self.options
        head = (
            f"dynamic sampling stopped at training step {self.step}: no signal at all, the first {self.rounds} "
            f"rounds ({self.finished} finished groups, {self.drawn} prompts drawn) kept no group; in every group "
            f"every response got the same {o.metric} ({self._shared_values()}). It stops after "
            f"{o.max_empty_rounds} such rounds instead of drawing up to {BOUND_KEY}={o.max_num_gen_batches} "
            "generation batches."
        )
        return self.exhausted_message(head) + (
            f"\nTo keep drawing up to the bound when no group is kept, set +{NO_SIGNAL_KEY}=0 (or a larger number "
            f"of rounds; now {o.max_empty_rounds}).")

    def exhausted_message(self, head: Optional[str] = None) -> str:
        o = self.options
        values = self._shared_values()
        constant = sum(self.filtered.values())
        head = head or (
            f"dynamic sampling stopped at training step {self.step}: it drew {self.drawn} prompts, the most "
            f"{BOUND_KEY}={o.max_num_gen_batches} allows ({o.max_num_gen_batches} generation "
            f"batch{'es' if o.max_num_gen_batches > 1 else ''} of "
            f"max_inflight_gen_batches × data.train_batch_size = {o.max_inflight_gen_batches} × "
            f"{o.train_batch_size} prompts), and only {self.kept} of the {self.need} groups the batch needs had a "
            f"varying {o.metric}: in {constant} of {self.finished} finished groups every response got the same "
            f"{o.metric} ({values or 'none finished'}).")
        lines = [head, "Likely causes:"]
        if not self.filtered or min(self.filtered) <= 0:
            lines += [
                "- the chat template: the prompts are not rendered as the model expects (a base model without a "
                "template, Qwen3's thinking mode: THINKING / data.apply_chat_template_kwargs.enable_thinking);",
                "- the answer format: the scorer cannot read the model's final answer (the data's instruction, "
                "e.g. 'Answer: $Answer', the data_source's scorer, or ground truths in another form);",
                "- the response length: responses are cut at data.max_response_length before the answer (raise it "
                "after the script name: data.max_response_length=<tokens>; verl logs response_length/clip_ratio);",
            ]
        if self.filtered and max(self.filtered) > 0:
            lines.append("- the data is too easy for the model (every response correct).")
        lines.append(
            "Look at a few responses (trainer.rollout_data_dir=DIR writes each step's). To let a step draw more, "
            f"raise {BOUND_KEY} (0: no bound, verl's behaviour); to train without dynamic sampling, set "
            "algorithm.filter_groups.enable=False after the script name.")
        return "\n".join(lines)


class _BoundedDraws:
    """The bound, the round lines and the metrics, over verl's `ReplayBuffer` or `ReplayBufferAsync` (see above;
    the private members of verl's buffer it uses: `rpg.replay_buffer`)."""

    options: SamplerOptions
    count: DrawCount

    def _bind(self, options: SamplerOptions) -> None:
        check_buffer(self)
        self.options, self.count, self._counted = options, DrawCount(options), set()
        self._draw = self.refill_fn
        if self._draw is not None:
            self.refill_fn = self._refill

    def _refill(self, num_prompts: int) -> int:
        granted = self.count.grant(num_prompts)
        if granted:
            return self._draw(granted)
        if in_flight(self, TRAIN) == 0:  # nothing drawn, nothing left to finish: the batch cannot fill
            raise DynamicSamplingExhausted(self.count.exhausted_message())
        return 0

    def _wait_for_next_poll(self, partition_id: str, last_debug_time: float) -> float:
        if partition_id == TRAIN and self.count.exhausted and in_flight(self, partition_id) == 0:
            raise DynamicSamplingExhausted(self.count.exhausted_message())
        return super()._wait_for_next_poll(partition_id, last_debug_time)

    def _dapo_filtered_keys(self, partition_id: str):
        uids, counts = super()._dapo_filtered_keys(partition_id)
        if partition_id == TRAIN and self.filter_groups_metric is not None:
            cache = classification_cache(self, partition_id)  # uid -> None (kept) or the shared value
            new = [cache[uid] for uid in cache if uid not in self._counted]
            self._counted = set(cache)  # only groups still finished: bounded, and none counted twice
            if new:
                filtered = Counter(v for v in new if v is not None)
                line = self.count.record(len(new) - sum(filtered.values()), filtered)
                if line:
                    print(line, flush=True)
                    if self.count.no_signal:
                        raise DynamicSamplingNoSignal(self.count.no_signal_message())
        return uids, counts

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        if partition_id != TRAIN or self.filter_groups_metric is None:
            return super().sample(global_steps, partition_id, batch_size)
        self.count.begin(global_steps, batch_size)
        batch, metrics = self._sample_filtered(global_steps, partition_id, batch_size)
        print(self.count.summary(), flush=True)
        return batch, {**metrics, **self.count.metrics()}

    def _sample_filtered(self, global_steps: int, partition_id: str, batch_size: int):
        """verl's sampling of a training batch with filtering on (a subclass may take it over)."""
        return super().sample(global_steps, partition_id, batch_size)


class BoundedReplayBuffer(_BoundedDraws, ReplayBuffer):
    """verl's sync `ReplayBuffer`, configured from `sampler_kwargs` as verl configures its built-in one, bounded.
    Built with an asynchronous `trainer_mode`, it returns a `BoundedReplayBufferAsync`."""

    def __new__(cls, *args, **kwargs):
        if modes.trainer_mode_named(kwargs.get("trainer_mode")).asynchronous:
            return cls.asynchronous(*args, **kwargs)
        return super().__new__(cls)

    asynchronous: Any = None  # the asynchronous class of this family (set below; rpg.cpu.sampler sets its own)

    def __init__(self, *, sampler_kwargs: Any = None, **kwargs):
        options = SamplerOptions.parse(sampler_kwargs)
        batch = options.train_batch_size
        super().__init__(
            sampler_kwargs=sampler_kwargs,
            train_batch_size=batch,
            gen_batch_size=1 if options.metric is not None else batch,
            max_inflight_gen_batches=options.max_inflight_gen_batches if options.metric else 1,
            **options.buffer_kwargs(),
            **kwargs,
        )
        self._bind(options)


class BoundedReplayBufferAsync(_BoundedDraws, ReplayBufferAsync):
    """verl's `ReplayBufferAsync` (colocate_async, separate_async; refills each evicted group once), bounded."""

    def __init__(self, *, sampler_kwargs: Any = None, **kwargs):
        if not modes.trainer_mode_named(kwargs.get("trainer_mode")).asynchronous:
            raise ValueError(
                f"{type(self).__name__} is for the asynchronous trainer modes; the sync trainer uses BoundedReplayBuffer"
            )
        options = SamplerOptions.parse(sampler_kwargs)
        super().__init__(sampler_kwargs=sampler_kwargs, **options.buffer_kwargs(), **kwargs)
        self._bind(options)

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int):
        if partition_id == TRAIN and self.filter_groups_metric is not None:
            self.count.begin(global_steps, target_count)
        return super().wait_for_sampleable(global_steps, partition_id, target_count)


BoundedReplayBuffer.asynchronous = BoundedReplayBufferAsync


def check_config(config: Any) -> None:
    """Before launch: `max_num_gen_batches` counts only through this module's sampler. Raises ValueError naming the
    keys when group filtering has a bound but the configured custom sampler is not a bounded one."""
    fg = config.algorithm.get("filter_groups", None) or {}
    if not fg.get("enable", False) or int(fg.get("max_num_gen_batches", 0) or 0) <= 0:
        return
    if int(fg.max_num_gen_batches) != fg.max_num_gen_batches:
        raise ValueError(f"{BOUND_KEY}={fg.max_num_gen_batches!r} is not a whole number")
    sampler = config.trainer.v1.sampler
    custom = sampler.get("custom_sampler", None) or {}
    cls = None
    if custom.get("path") and custom.get("name"):
        from verl.utils.import_utils import load_extern_object

        cls = load_extern_object(custom.path, custom.name)
    if not (isinstance(cls, type) and issubclass(cls, _BoundedDraws)):
        where = f"{custom.get('path')}:{custom.get('name')}" if cls is not None else "verl's built-in replay buffer"
        raise ValueError(
            f"{BOUND_KEY}={fg.max_num_gen_batches} is ignored by {where}: set trainer.v1.sampler.custom_sampler."
            "path=pkg://rpg.dynamic_sampling and .name=BoundedReplayBuffer (rpg/config/rpg_trainer.yaml's setting, "
            f"or a subclass), or {BOUND_KEY}=0 for no bound"
        )
    kwargs = sampler.get("sampler_kwargs", None) or {}
    expected = {"train_batch_size": config.data.train_batch_size, "filter_groups": fg}
    for key, value in expected.items():
        if key not in kwargs or kwargs[key] != value:
            src = "data.train_batch_size" if key == "train_batch_size" else "algorithm.filter_groups"
            raise ValueError(
                f"trainer.v1.sampler.sampler_kwargs.{key} must equal {src}: set it to '${{{src}}}' "
                "(rpg/config/rpg_trainer.yaml does)"
            )
