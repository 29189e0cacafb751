"""A v1 replay buffer with a short poll interval, for CPU runs where steps take seconds, not minutes.

verl 0.9.1's sync v1 trainer samples through `ReplayBuffer`, which sleeps a hard-coded ``poll_interval=2.0`` s
between polls of TransferQueue (`verl/trainer/ppo/v1/replay_buffer.py`). On a tiny CPU model that sleep is most of
a step (cpu-rollout.md §6). verl's own hook for a different sampler is ``trainer.v1.sampler.custom_sampler``; a
custom sampler receives only ``trainer.v1.sampler.sampler_kwargs`` (free-form) and not DAPO's group-filter settings,
so this class reads them from there. The CPU profile wires them by Hydra interpolation, so they always equal the
trainer's own settings::

    trainer.v1.sampler.custom_sampler.path=pkg://rpg.cpu.sampler
    trainer.v1.sampler.custom_sampler.name=FastPollReplayBuffer
    +trainer.v1.sampler.sampler_kwargs.poll_interval=0.05
    +trainer.v1.sampler.sampler_kwargs.filter_groups='${algorithm.filter_groups}'
    +trainer.v1.sampler.sampler_kwargs.train_batch_size='${data.train_batch_size}'

With ``filter_groups.enable=True`` it configures the parent exactly as the trainer configures the built-in buffer
(`trainer_base.py` ``_build_replay_buffer``: ``gen_batch_size=1``, ``max_inflight_gen_batches`` from the config);
otherwise it generates whole training batches.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

DEFAULT_POLL_INTERVAL = 0.05


class FastPollReplayBuffer(ReplayBuffer):
    """`ReplayBuffer` for the sync trainer with ``poll_interval`` (and DAPO filtering) taken from ``sampler_kwargs``."""

    def __init__(self, *, sampler_kwargs: Any = None, **kwargs):
        opts = dict(sampler_kwargs or {})
        unknown = set(opts) - {"poll_interval", "filter_groups", "train_batch_size"}
        if unknown:
            raise ValueError(f"FastPollReplayBuffer: unknown sampler_kwargs {sorted(unknown)}; "
                             f"valid: ['filter_groups', 'poll_interval', 'train_batch_size']")
        if kwargs.get("trainer_mode", "sync") != "sync":
            raise ValueError(f"FastPollReplayBuffer supports trainer.v1.trainer_mode=sync only, "
                             f"got {kwargs.get('trainer_mode')!r}")
        if "train_batch_size" not in opts:
            raise ValueError("FastPollReplayBuffer needs trainer.v1.sampler.sampler_kwargs.train_batch_size "
                             "(set it to '${data.train_batch_size}')")
        filter_groups = opts.get("filter_groups") or {}
        metric = filter_groups.get("metric") if filter_groups.get("enable", False) else None
        if filter_groups.get("enable", False) and not metric:
            raise ValueError("algorithm.filter_groups.metric must be set when group filtering is enabled")
        batch = int(opts["train_batch_size"])
        super().__init__(
            sampler_kwargs=sampler_kwargs,
            poll_interval=float(opts.get("poll_interval", DEFAULT_POLL_INTERVAL)),
            filter_groups_metric=metric,
            train_batch_size=batch,
            gen_batch_size=1 if metric is not None else batch,
            max_inflight_gen_batches=int(filter_groups.get("max_inflight_gen_batches", 1)) if metric else 1,
            **kwargs,
        )
