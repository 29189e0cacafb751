"""rpg/cpu/sampler.py: a training batch depends on the data and the samples, not on when each group finished.

verl's sync `ReplayBuffer.sample` runs here against an in-memory TransferQueue. The "rollout" finishes the in-flight
groups a few at a time, in an order drawn from a schedule seed, and hands each group's n samples to its sessions in
a random order (as arrival order at the rollout server does). Every schedule must give the same batch (same groups,
same samples, same order) and draw the same number of prompts from the data loader.
"""

from __future__ import annotations

import random
import time
import uuid

import pytest
import torch
import verl.trainer.ppo.v1.replay_buffer as verl_replay_buffer
from omegaconf import OmegaConf

import rpg.cpu.sampler as rpg_sampler
from rpg.cpu.sampler import FastPollReplayBuffer

N = 4  # samples per prompt


class FakeTransferQueue:
    """The three TransferQueue calls the replay buffer makes, on ordered dicts (insertion order, as TransferQueue)."""

    def __init__(self):
        self.tags: dict[str, dict[str, dict]] = {}
        self.fields: dict[str, dict[str, dict]] = {}

    def kv_list(self, partition_id=None):
        return {p: {k: dict(t) for k, t in items.items()} for p, items in self.tags.items()}

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.tags[partition_id].pop(key, None)
            self.fields[partition_id].pop(key, None)

    def kv_batch_get(self, keys, partition_id, select_fields):
        rows = [self.fields[partition_id][k] for k in keys]
        out = {}
        for name in select_fields:
            values = [r[name] for r in rows]
            out[name] = torch.nested.nested_tensor(values, layout=torch.jagged) if name == "responses" else values
        return out

    def put(self, partition_id, key, tag, fields=None):
        self.tags.setdefault(partition_id, {}).setdefault(key, {}).update(tag)
        if fields is not None:
            self.fields.setdefault(partition_id, {})[key] = fields


class FakeRollout:
    """Prompts 0, 1, 2, ... from a "data loader"; prompt p's n samples are fixed, their acc is constant (the group is
    filtered by DAPO) when ``evicted(p)``. Drawn from ``schedule_seed``: which in-flight groups finish at each poll,
    which copy (session) of a prompt receives which of its samples, and the order its trajectories are stored in."""

    def __init__(self, store: FakeTransferQueue, evicted, schedule_seed: int):
        self.store, self.evicted, self.rng = store, evicted, random.Random(schedule_seed)
        self.next_prompt, self.inflight, self.prompt_of = 0, [], {}

    def samples(self, p):
        return [([p, j, (p * j) % 5], 1.0 if self.evicted(p) else float(j % 2)) for j in range(N)]

    def dispatch(self, count: int) -> int:
        for _ in range(count):
            uid = str(uuid.uuid4())  # verl's uid: random
            self.prompt_of[uid] = self.next_prompt
            self.store.put("train", uid, {"is_prompt": True, "status": "pending", "global_steps": 1})
            self.inflight.append(uid)
            self.next_prompt += 1
        return count

    def finish_some(self):
        done = self.rng.sample(self.inflight, self.rng.randint(1, len(self.inflight))) if self.inflight else []
        for uid in done:
            self.inflight.remove(uid)
            received = self.rng.sample(self.samples(self.prompt_of[uid]), N)  # copy <- sample: arrival order
            for session in self.rng.sample(range(N), N):  # trajectories reach TransferQueue in completion order
                tokens, acc = received[session]
                fields = {"responses": torch.tensor(tokens), "extra_fields": {"reward_extra_info": {"acc": acc}}}
                self.store.put("train", f"{uid}_{session}_0", {"status": "success", "seq_len": len(tokens)}, fields)
            self.store.put("train", uid, {"status": "finished"})


def run_step(monkeypatch, evicted, max_inflight, schedule_seed, batch_size=8):
    store = FakeTransferQueue()
    monkeypatch.setattr(verl_replay_buffer, "tq", store)
    monkeypatch.setattr(rpg_sampler, "tq", store)
    rollout = FakeRollout(store, evicted, schedule_seed)
    buf = FastPollReplayBuffer(
        trainer_mode="sync", trainer_config=OmegaConf.create({}), max_off_policy_threshold=None,
        max_off_policy_strategy="drop", refill_fn=rollout.dispatch,
        sampler_kwargs=OmegaConf.create({"poll_interval": 0.0, "train_batch_size": batch_size, "filter_groups": {
            "enable": True, "metric": "acc", "max_inflight_gen_batches": max_inflight}}))
    monkeypatch.setattr(buf, "_wait_for_next_poll", lambda partition_id, last: (rollout.finish_some(), time.time())[1])
    rollout.dispatch(batch_size)  # the trainer's prepare_step: one batch of prompts
    rollout.finish_some()
    batch, metrics = buf.sample(global_steps=1, partition_id="train", batch_size=batch_size)
    got = [(rollout.prompt_of[k.rsplit("_", 2)[0]], tuple(store.fields["train"][k]["responses"].tolist()))
           for k in batch.keys]
    return got, rollout.next_prompt, metrics


@pytest.mark.parametrize("evicted, max_inflight", [
    (lambda p: p % 3 == 0, 3),   # a third of the groups filtered: one refill round, a surplus to discard
    (lambda p: p % 3 != 2, 1),   # two thirds filtered, refills capped at one batch in flight: several rounds
])
def test_dapo_batch_is_independent_of_completion_order(monkeypatch, evicted, max_inflight):
    runs = [run_step(monkeypatch, evicted, max_inflight, seed) for seed in range(6)]
    batch, drawn, metrics = runs[0]
    for other in runs[1:]:
        assert other[0] == batch and other[1] == drawn
    # verl's rules: the oldest usable groups in dispatch order, each group's samples sorted by content
    usable = [p for p in range(drawn) if not evicted(p)]
    assert [p for p, _ in batch[::N]] == usable[:8]
    assert [s for _, s in batch[:N]] == sorted(s for _, s in batch[:N])
    assert metrics["training/filter_groups/evicted_samples"] == drawn - len(usable)
    assert metrics.get("training/filter_groups/discarded_surplus_samples", 0) == len(usable) - 8
