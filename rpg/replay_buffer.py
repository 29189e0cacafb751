"""The one adapter over verl's v1 replay buffer (verl/trainer/ppo/v1/replay_buffer.py), for rpg's samplers:
`rpg.dynamic_sampling` (the bound on the prompts of a step) and `rpg.cpu.sampler` (the CPU profile's fast,
timing-independent polling).

verl 0.9.1 lets a run name its own sampler (``trainer.v1.sampler.custom_sampler``) but gives it no public API: a
sampler subclasses verl's `ReplayBuffer` / `ReplayBufferAsync` and works with their private methods and state. Every
private member rpg uses is listed here, with verl's parameters, and checked when rpg builds a buffer
(`check_buffer`: the verl version, each method's signature, then the buffer's state attributes). A verl whose buffer
changed fails there, naming the member, instead of misbehaving mid-run; importing this module checks nothing (the
launcher imports the samplers before it refuses an unsupported verl with its own message). Nothing is patched: rpg's
samplers are subclasses, selected by the run's config.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1 import replay_buffer as verl_replay_buffer

from rpg.compat import SUPPORTED_VERL, require_signature, require_version

__all__ = ["ReplayBuffer", "ReplayBufferAsync", "accumulate_eviction_metrics", "check", "check_buffer",
           "classification_cache", "in_flight"]

WHAT = "rpg's samplers over verl's v1 replay buffer (rpg/replay_buffer.py)"

ReplayBuffer = verl_replay_buffer.ReplayBuffer
ReplayBufferAsync = verl_replay_buffer.ReplayBufferAsync

#: the private methods rpg's samplers override or call, with verl 0.9.1's parameters
METHODS = {
    (ReplayBuffer, "sample"): ("self", "global_steps", "partition_id", "batch_size"),
    (ReplayBuffer, "_wait_for_next_poll"): ("self", "partition_id", "last_debug_time"),
    (ReplayBuffer, "_dapo_filtered_keys"): ("self", "partition_id"),
    (ReplayBuffer, "_select_prompt_uids"): ("self", "partition_id", "sampleable_keys", "batch_size"),
    (ReplayBuffer, "_materialize_batch"): ("self", "partition_id", "selected_prompt_uids", "partition_snapshot"),
    (ReplayBuffer, "_sync_metadata_from_transfer_queue"): ("self",),
    (ReplayBuffer, "_terminal_eviction_reasons"): ("self", "global_steps", "partition_id"),
    (ReplayBuffer, "_evict_terminal_groups"): ("self", "global_steps", "partition_id", "eviction_reasons"),
    (ReplayBuffer, "_sampleable_terminal_keys"): ("self", "partition_id", "eviction_reasons"),
    (ReplayBuffer, "_clear_groups"): ("self", "partition_id", "uids"),
    (ReplayBuffer, "_metrics_prefix"): ("partition_id",),
    (ReplayBufferAsync, "wait_for_sampleable"): ("self", "global_steps", "partition_id", "target_count"),
}
#: the module-level helper rpg.cpu.sampler calls
HELPERS = {"_accumulate_eviction_metrics": ("acc", "new", "stale_count")}
#: the state (set by verl's ``__init__``) rpg's samplers read or replace
STATE = ("refill_fn", "pending_keys", "running_keys", "_dapo_classification_cache", "filter_groups_metric",
         "prompt_global_steps", "partitions", "gen_batch_size", "max_inflight_gen_batches", "train_batch_size")


def check() -> None:
    """RuntimeError unless verl's version is supported and every method and helper above has verl's signature."""
    require_version("verl", SUPPORTED_VERL, WHAT)
    members = [(f"{cls.__name__}.{name}", getattr(cls, name, None), params) for (cls, name), params in METHODS.items()]
    members += [(name, getattr(verl_replay_buffer, name, None), params) for name, params in HELPERS.items()]
    for where, member, params in members:
        if member is None:
            raise RuntimeError(f"{WHAT}: verl's replay buffer has no {where}; rpg needs verl {SUPPORTED_VERL}")
        require_signature(member, params, f"{WHAT}, at verl's {where}")


def check_buffer(buffer: Any) -> None:
    """`check`, then RuntimeError naming the state attributes (`STATE`) a freshly built verl buffer lacks."""
    check()
    missing = [name for name in STATE if not hasattr(buffer, name)]
    if missing:
        raise RuntimeError(
            f"{WHAT}: {type(buffer).__name__}, built by verl's ReplayBuffer.__init__, has no {', '.join(missing)}: "
            f"this verl's replay buffer is not the one rpg supports ({SUPPORTED_VERL})"
        )


def accumulate_eviction_metrics(acc: dict, new: dict, stale_count: int) -> None:
    """verl's ``_accumulate_eviction_metrics``: add one eviction round's metrics `new` to `acc`."""
    verl_replay_buffer._accumulate_eviction_metrics(acc, new, stale_count)


def in_flight(buffer: Any, partition_id: str) -> int:
    """Requests of `partition_id` still pending or running in `buffer`."""
    return len(buffer.pending_keys[partition_id]) + len(buffer.running_keys[partition_id])


def classification_cache(buffer: Any, partition_id: str) -> dict:
    """verl's DAPO classification of the finished groups of `partition_id`: uid → None (kept) or the shared value."""
    return buffer._dapo_classification_cache[partition_id]
