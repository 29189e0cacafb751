"""A v1 replay buffer for CPU runs: a short poll interval, and batches that depend on the seed only, not on timing.

verl 0.9.1's sync v1 trainer samples through `ReplayBuffer`, which sleeps a hard-coded ``poll_interval=2.0`` s
between polls of TransferQueue (`verl/trainer/ppo/v1/replay_buffer.py`). On a tiny CPU model that sleep is most of
a step (docs/cpu.md#sampler). verl's own hook for a different sampler is ``trainer.v1.sampler.custom_sampler``; a
custom sampler receives only ``trainer.v1.sampler.sampler_kwargs`` (free-form) and not DAPO's group-filter settings,
so this class reads them from there, as its parent `rpg.dynamic_sampling.BoundedReplayBuffer` (the recipes' sampler:
verl's buffer with ``max_num_gen_batches`` bounding the prompts of a step) does; rpg/config/rpg_trainer.yaml wires
them by Hydra interpolation, so they always equal the trainer's own settings, and the CPU profile sets::

    trainer.v1.sampler.custom_sampler.path=pkg://rpg.cpu.sampler
    trainer.v1.sampler.custom_sampler.name=FastPollReplayBuffer
    +trainer.v1.sampler.sampler_kwargs.poll_interval=0.05

With ``filter_groups.enable=True`` it configures the parent exactly as the trainer configures the built-in buffer
(`trainer_base.py` ``_build_replay_buffer``: ``gen_batch_size=1``, ``max_inflight_gen_batches`` from the config);
otherwise it generates whole training batches.

Determinism. verl's buffer decides on whatever has finished at each poll, so a run depends on completion timing
(machine load), not only on its seed:

* it picks the training groups from a ``set`` of random ``uuid4`` uids (ties in ``global_steps`` are broken by set
  order) and orders their samples by completion (TransferQueue insertion order); the order decides the mini-batches;
* DAPO (``filter_groups``) evicts, refills (2 prompts per evicted group) and stops refilling at each poll, so how
  many prompts a step draws from the data loader, and so every later step's prompts, depend on which groups happened
  to have finished.

This buffer keeps verl's rules (the private members of verl's buffer it uses are listed and version-guarded in
`rpg.replay_buffer`) and removes the timing: DAPO decisions are taken on whole rounds of generation (only
when nothing is in flight), groups are selected in dispatch order (the data loader's order, the order in which
TransferQueue registered their uids), and a batch lists its groups in that order with each group's samples sorted
by their response tokens (the ``n`` copies of a prompt are interchangeable, so which copy received which sample
depends on arrival order at the rollout server; the sorted order does not). With the rollout's per-request seeds
(`rpg.cpu.hf_rollout`) a run is then a function of its seed on a given machine.

Asynchronous trainers (``trainer.v1.trainer_mode=colocate_async|separate_async``). The same custom-sampler setting then
builds `FastPollReplayBufferAsync`: verl's ``ReplayBufferAsync`` (staleness cap, DAPO evict k / refill k, oldest
groups first), bounded, with the poll interval and the DAPO metric from ``sampler_kwargs``, so the CPU profile can keep one
sampler setting for every trainer mode. No determinism is promised there: which responses a step trains on depends
on what had finished, as in verl.
"""

from __future__ import annotations

import time
from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.utils.skip import SkipManager

from rpg.dynamic_sampling import BoundedReplayBuffer, BoundedReplayBufferAsync
from rpg.replay_buffer import accumulate_eviction_metrics, in_flight

DEFAULT_POLL_INTERVAL = 0.05


def _with_poll(sampler_kwargs: Any) -> dict:
    """``sampler_kwargs`` with this module's default poll interval."""
    return {"poll_interval": DEFAULT_POLL_INTERVAL, **dict(sampler_kwargs or {})}


def _session_of(key: str) -> tuple[str, int, int]:
    """``(uid, session_id, index)`` of a trajectory key ``{uid}_{session_id}_{index}``."""
    uid, session, index = key.rsplit("_", 2)
    return uid, int(session), int(index)


class FastPollReplayBuffer(BoundedReplayBuffer):
    """`BoundedReplayBuffer` (verl's `ReplayBuffer` with ``max_num_gen_batches`` bounding the prompts of a step) for
    the sync trainer with a short ``poll_interval`` and timing-independent batches (see the module docstring)."""

    def __init__(self, *, sampler_kwargs: Any = None, **kwargs):
        super().__init__(sampler_kwargs=_with_poll(sampler_kwargs), **kwargs)

    # ---- order: dispatch order of the groups, then each group's samples by content ------------------------------
    def _select_prompt_uids(self, partition_id: str, sampleable_keys: set[str], batch_size: int):
        """The oldest ``batch_size`` groups (verl's rule), ties broken by dispatch order instead of set order."""
        steps = dict(self.prompt_global_steps[partition_id])  # insertion order = dispatch order (TransferQueue)
        rank = {uid: i for i, uid in enumerate(steps)}
        ordered = sorted(sampleable_keys, key=lambda uid: (steps.get(uid, 0), rank.get(uid, len(rank))))
        return ordered[:batch_size], dict(self.partitions[partition_id]), steps

    def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict):
        """verl's batch, reordered: groups in selection order, each group's samples sorted by response tokens."""
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        if not batch.keys:
            return batch
        responses = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id, select_fields=["responses"])
        responses = responses["responses"]
        rows = responses.unbind() if getattr(responses, "is_nested", False) else responses
        group = {uid: i for i, uid in enumerate(selected_prompt_uids)}

        def sort_key(i: int):
            uid, session, index = _session_of(batch.keys[i])
            return group[uid], tuple(rows[i].tolist()), session, index

        order = sorted(range(len(batch.keys)), key=sort_key)
        return KVBatchMeta(partition_id=batch.partition_id, keys=[batch.keys[i] for i in order],
                           tags=[batch.tags[i] for i in order], fields=batch.fields, extra_info=batch.extra_info)

    # ---- DAPO on whole rounds ----------------------------------------------------------------------------------
    @SkipManager.annotate_tq(role="rollout_tq", phase="sample")  # verl's rollout-skip cache, as on verl's sample
    def _sample_filtered(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """DAPO sampling with every decision taken when no request is in flight.

        Each round: evict the groups whose ``filter_groups.metric`` is constant (and failed groups), then either
        select the ``batch_size`` oldest remaining groups (the surplus is discarded, as verl does) or refill 2
        prompts per evicted group (and 1 per failed one), at most ``max_inflight_gen_batches × train_batch_size``
        at once, and wait for that round.
        """
        metrics: dict = {}
        credit, limit = 0, self.max_inflight_gen_batches * self.train_batch_size
        last_debug = time.time()
        while True:
            self._sync_metadata_from_transfer_queue()
            if in_flight(self, partition_id):
                last_debug = self._wait_for_next_poll(partition_id, last_debug)
                continue
            reasons = self._terminal_eviction_reasons(global_steps, partition_id)
            evicted, stale, dapo_count, new_metrics = self._evict_terminal_groups(global_steps, partition_id, reasons)
            if evicted:
                accumulate_eviction_metrics(metrics, new_metrics, stale)
            sampleable = self._sampleable_terminal_keys(partition_id, reasons)
            if len(sampleable) >= batch_size:
                break
            credit += 2 * dapo_count + len(reasons[2])
            dispatch = min(credit, limit)
            dispatch -= dispatch % self.gen_batch_size
            if dispatch <= 0:
                raise RuntimeError(f"FastPollReplayBuffer: {len(sampleable)} of {batch_size} groups usable, nothing "
                                   f"in flight and nothing to refill (step {global_steps})")
            self.refill_fn(dispatch)
            credit -= dispatch
        selected, snapshot, _ = self._select_prompt_uids(partition_id, sampleable, batch_size)
        chosen = set(selected)
        surplus = sampleable - chosen
        if surplus:
            self._clear_groups(partition_id, surplus)
            key = f"{self._metrics_prefix(partition_id)}/filter_groups/discarded_surplus_samples"
            metrics[key] = metrics.get(key, 0) + len(surplus)
        if not any(_session_of(key)[0] in chosen for key in snapshot):
            raise RuntimeError("FastPollReplayBuffer: the selected groups have no trajectories (all failed); enable "
                               "trainer.v1.sampler.sync_refill_failed_groups to replace failed groups")
        return self._materialize_batch(partition_id, selected, snapshot), metrics


class FastPollReplayBufferAsync(BoundedReplayBufferAsync):
    """`BoundedReplayBufferAsync` (verl's `ReplayBufferAsync`, bounded; asynchronous trainer modes) with a short
    ``poll_interval`` (``train_batch_size`` sizes the bound and the round lines: async DAPO refills exactly the evicted
    groups)."""

    def __init__(self, *, sampler_kwargs: Any = None, **kwargs):
        super().__init__(sampler_kwargs=_with_poll(sampler_kwargs), **kwargs)


FastPollReplayBuffer.asynchronous = FastPollReplayBufferAsync
