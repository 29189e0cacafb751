"""Writing the reference engine's weights from the actor's, in place, on every rank's own shards: the periodic
reference's copy (π_ref ← π_θ) and the EMA reference's blend (π_ref ← τ·π_ref + (1 − τ)·π_θ).

Both act on the modules of verl's FSDP/FSDP2 engines (`engine_module`) and must be called on every rank.
"""

from __future__ import annotations

from typing import Any

import torch

from rpg.shards import local_shard

__all__ = ["blend_policy_weights", "copy_policy_weights", "engine_module", "reshard_fsdp2"]


def reshard_fsdp2(module: torch.nn.Module) -> None:
    """Put every FSDP2 sub-module in its sharded state, so the registered parameters are the up-to-date shards."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - old torch
        return
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def engine_module(training_worker: Any, what: str) -> torch.nn.Module:
    """The torch module of a verl ``TrainingWorker``'s engine; NotImplementedError naming the engine otherwise."""
    module = getattr(getattr(training_worker, "engine", None), "module", None)
    if not isinstance(module, torch.nn.Module):
        raise NotImplementedError(
            f"reference='periodic'/'ema' write weights between torch modules; the {what} engine "
            f"{type(getattr(training_worker, 'engine', None)).__name__} exposes none (supported: FSDP/FSDP2 engines, "
            "actor_rollout_ref.actor.strategy=fsdp|fsdp2)"
        )
    return module


def copy_policy_weights(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """Overwrite ``dst``'s parameters and buffers with ``src``'s (π_ref ← π_θ), in place.

    Works for plain modules and FSDP/FSDP2-wrapped ones through torch's distributed state-dict API (sharded state
    dicts: each rank copies its own shards; collective when the layouts differ). Must be called on every rank.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    reshard_fsdp2(src)
    reshard_fsdp2(dst)
    with torch.no_grad():
        state = get_model_state_dict(src)
        result = set_model_state_dict(dst, state)
    missing = list(getattr(result, "missing_keys", []) or [])
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if missing or unexpected:
        raise RuntimeError(
            f"reference refresh: actor and reference models differ (missing in actor: {missing[:5]}, "
            f"unexpected: {unexpected[:5]}); both must be built from actor_rollout_ref.model"
        )


def blend_policy_weights(src: torch.nn.Module, dst: torch.nn.Module, decay: float) -> None:
    """π_ref ← τ·π_ref + (1 − τ)·π_θ on the parameters (``dst`` = reference, ``src`` = actor, τ = ``decay``), in
    place, on this rank's own shards: no collective, no gather of the full model.

    Computed in fp32 as ``torch.lerp(ref, actor, 1 − τ)`` (exactly the actor at τ = 0) into the reference's fp32
    shards wherever they live (on GPU runs with parameter offload: the reference's CPU copy; the actor's shard is
    moved there one tensor at a time). The reference must be stored in fp32: rounding a blend at τ ≈ 0.99 to bf16
    would not move it (each step changes a weight by (1 − τ)·|θ − ref|, below half a bf16 ulp); verl's reference is
    fp32 unless ``actor_rollout_ref.ref.fsdp_config.model_dtype`` says otherwise, which the launcher refuses with
    ``reference=ema``. Buffers (rotary tables, ...) are constants shared by both models and are not touched. Both
    modules must have the same parameters with the same sharding (verl builds both from actor_rollout_ref.model with
    the same FSDP2 mesh); otherwise RuntimeError. Must be called on every rank (each blends its own shards).
    """
    if not (0.0 <= decay < 1.0):
        raise ValueError(f"EMA reference: decay τ must be in [0, 1), got {decay!r}")
    reshard_fsdp2(src)
    reshard_fsdp2(dst)
    actor, ref = dict(src.named_parameters()), dict(dst.named_parameters())
    if actor.keys() != ref.keys():
        raise RuntimeError(
            f"EMA reference: actor and reference parameters differ (only in actor: "
            f"{sorted(actor.keys() - ref.keys())[:5]}, only in reference: {sorted(ref.keys() - actor.keys())[:5]}); "
            "both must be built from actor_rollout_ref.model"
        )
    weight = 1.0 - float(decay)
    with torch.no_grad():
        for name, p in ref.items():
            a = actor[name]
            if getattr(a, "placements", None) != getattr(p, "placements", None) or a.shape != p.shape:
                raise RuntimeError(
                    f"EMA reference: parameter {name} is sharded differently in the actor "
                    f"({getattr(a, 'placements', None)}, {tuple(a.shape)}) and the reference "
                    f"({getattr(p, 'placements', None)}, {tuple(p.shape)}); the blend works shard by shard and needs "
                    "both engines on the same FSDP2 layout (actor_rollout_ref.actor/ref.strategy=fsdp2, same mesh)"
                )
            local_ref, local_actor = local_shard(p), local_shard(a)
            if local_ref.dtype != torch.float32:
                raise RuntimeError(
                    f"EMA reference: parameter {name} of the reference is stored in {local_ref.dtype}; the blend "
                    "needs fp32 storage (a bf16 blend at τ≈0.99 never moves). Set "
                    "actor_rollout_ref.ref.fsdp_config.model_dtype=fp32 (verl's default)"
                )
            if local_ref.shape != local_actor.shape:
                raise RuntimeError(
                    f"EMA reference: local shards of {name} differ: {local_ref.shape} vs {local_actor.shape}"
                )
            local_ref.lerp_(local_actor.to(device=local_ref.device, dtype=torch.float32), weight)
