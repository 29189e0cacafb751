"""The periodic reference under LoRA (docs/reference-modes.md#lora): π_ref is a snapshot of the policy's adapter on
the shared base, kept beside it on every rank, swapped in for verl's reference pass and swapped out bit for bit after
it.

verl 0.9.1 has no reference engine in a LoRA run: it calls the actor's ``compute_log_prob`` with
``no_lora_adapter=True`` in the batch (``ref_in_actor``, verl/trainer/ppo/v1/trainer_base.py ``_compute_ref_log_prob``)
and the worker runs that pass under the engine's ``disable_adapter()`` (verl/workers/engine_workers.py
``infer_batch``): the adapter-free base, which is the ``frozen`` reference. For ``periodic`` (paper §5, "Iterative
reference updates") the worker hooks' piece of ``compute_log_prob`` (`rpg.reference.hooks`) takes that flag out of
the batch (so verl keeps the adapter on), puts the snapshot's values into the adapter's parameters in place, runs
verl's pass, and restores the policy's values in a ``finally``, before any other call of the worker (the rollout's
weight sync, merged or not, runs in ``update_weights``, never inside the pass).

* `AdapterSnapshot`: fp32 copies of this rank's own shards of the adapter's parameters (the LoRA A/B factors, peft's
  ``lora_A``/``lora_B``; FSDP2 DTensors keep their placements), taken at the first reference pass (the initial
  adapter: the base when B = 0, the loaded adapter with ``lora_adapter_path``) and re-taken on the refresh schedule.
  Memory: twice the adapter's parameters in fp32 per model (one snapshot, one saved copy during the pass).
* `LoraPeriodicReference`: the ``periodic`` row's worker state in a LoRA run (`rpg.reference.periodic` with the
  snapshot in place of the reference engine): the same `RefreshSchedule`, metrics and checkpoint files
  (`rpg.reference.written`: ``state.json`` records ``lora_snapshot: true``, ``ref_model/`` holds the snapshot).
* `reference_pass_flag`: whether a batch is verl's reference pass in a LoRA run (also read by the top-k hook,
  `rpg.topk_hook`, which selects the top-k support in that pass).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch

from rpg import modes
from rpg.reference.periodic import PeriodicReference
from rpg.reference.ranks import rank
from rpg.reference.schedule import RefreshSchedule
from rpg.reference.weights import engine_module, reshard_fsdp2
from rpg.shards import local_shard

__all__ = ["AdapterSnapshot", "LoraPeriodicReference", "adapter_parameters", "pop_reference_pass_flag",
           "reference_pass_flag"]

#: verl's key of the reference pass in a LoRA run (trainer_base.py / engine_workers.py)
NO_LORA_ADAPTER = "no_lora_adapter"
#: peft's names of a LoRA layer's adapter parameters (peft.tuners.lora.LoraLayer.adapter_layer_names)
ADAPTER_LAYERS = frozenset({"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"})


# ---- the flag of verl's reference pass -------------------------------------------------------------------------------
def _flags(data: Any) -> Optional[Any]:
    """The dict-like that holds the batch's non-tensor flags: TransferQueue metadata's ``extra_info`` (v1 trainer), a
    DataProto's ``meta_info`` (legacy trainer), or None for a TensorDict (verl's ``tensordict_utils``)."""
    if hasattr(data, "batch_size"):
        return None
    for name in ("extra_info", "meta_info"):
        found = getattr(data, name, None)
        if isinstance(found, dict):
            return found
    return None


def _flag(data: Any, take: bool) -> bool:
    """verl's ``no_lora_adapter`` of the batch (removed from it when `take`), wherever the batch keeps it."""
    flags = _flags(data)
    if flags is not None:
        return bool(flags.pop(NO_LORA_ADAPTER, False) if take else flags.get(NO_LORA_ADAPTER, False))
    if hasattr(data, "batch_size"):
        from verl.utils import tensordict_utils as tu  # verl at the first call: importing this module imports none

        if take:
            return bool(tu.pop(data, key=NO_LORA_ADAPTER, default=False))
        return bool(tu.get_non_tensor_data(data=data, key=NO_LORA_ADAPTER, default=False))
    return False


def reference_pass_flag(data: Any) -> bool:
    """Whether the batch carries verl's ``no_lora_adapter=True`` (the reference pass of a LoRA run)."""
    return _flag(data, take=False)


def pop_reference_pass_flag(data: Any) -> bool:
    """Remove ``no_lora_adapter`` from the batch (verl then keeps the adapter on); whether it was set."""
    return _flag(data, take=True)


# ---- the snapshot --------------------------------------------------------------------------------------------------
def adapter_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The LoRA adapter's parameters of `module` (peft's ``lora_A``/``lora_B`` factors, by name); RuntimeError when it
    has none (not a peft LoRA model)."""
    found = {n: p for n, p in module.named_parameters() if ADAPTER_LAYERS & set(n.split("."))}
    if not found:
        raise RuntimeError(
            "the LoRA periodic reference found no LoRA adapter parameters (peft's lora_A/lora_B) in the actor's model: "
            "it needs verl's FSDP engine with actor_rollout_ref.model.lora_rank > 0 (or lora_adapter_path)"
        )
    return found


class AdapterSnapshot:
    """The reference adapter: an fp32 copy of this rank's own shards of the policy adapter's parameters."""

    def __init__(self) -> None:
        self.tensors: Optional[dict[str, torch.Tensor]] = None  # name -> fp32 copy (a DTensor for an FSDP2 parameter)

    @property
    def taken(self) -> bool:
        return self.tensors is not None

    def _params(self, module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
        reshard_fsdp2(module)  # the registered parameters are the up-to-date shards
        params = adapter_parameters(module)
        if self.tensors is not None and params.keys() != self.tensors.keys():
            differ = sorted(params.keys() ^ self.tensors.keys())[:5]
            raise RuntimeError(f"LoRA reference snapshot: the adapter's parameters changed names ({differ})")
        return params

    def take(self, module: torch.nn.Module) -> None:
        """π_ref ← π_θ: copy the adapter's local shards into the snapshot (fp32), in place once it exists."""
        params = self._params(module)
        with torch.no_grad():
            if self.tensors is None:
                self.tensors = {n: p.detach().to(torch.float32).clone() for n, p in params.items()}
                return
            for n, p in params.items():
                local_shard(self.tensors[n]).copy_(local_shard(p.detach()))

    @contextlib.contextmanager
    def swapped(self, module: torch.nn.Module) -> Iterator[None]:
        """The adapter holds the snapshot's values inside the block; the policy's values, bit for bit, after it."""
        if self.tensors is None:
            raise RuntimeError("LoRA reference snapshot: swapped in before it was taken")
        params = self._params(module)
        saved = {}
        with torch.no_grad():
            for n, p in params.items():
                local = local_shard(p)
                saved[n] = local.clone()
                local.copy_(local_shard(self.tensors[n]))  # cast to the adapter's dtype, on its device
        try:
            yield
        finally:
            reshard_fsdp2(module)
            with torch.no_grad():
                for n, p in adapter_parameters(module).items():
                    local_shard(p).copy_(saved[n])

    def verify(self, module: torch.nn.Module) -> tuple[int, float]:
        """Check, on this rank, that the snapshot equals the adapter's local shards (in fp32). Returns (tensors
        compared, float64 checksum of the snapshot's local shards); RuntimeError naming the first that differs."""
        params = self._params(module)
        checksum = 0.0
        with torch.no_grad():
            for n, p in params.items():
                mine = local_shard(self.tensors[n])
                if not torch.equal(local_shard(p).to(device=mine.device, dtype=mine.dtype), mine):
                    raise RuntimeError(f"LoRA reference refresh check: rank {rank()}'s snapshot of {n} differs from "
                                       "the policy adapter's shard after the refresh")
                checksum += float(mine.double().sum())
        return len(params), checksum

    def template(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """fp32 tensors shaped and sharded like the adapter's parameters (what a checkpoint loads into)."""
        with torch.no_grad():
            return {n: p.detach().to(torch.float32).clone() for n, p in self._params(module).items()}


# ---- the worker state --------------------------------------------------------------------------------------------
class LoraPeriodicReference(PeriodicReference):
    """The ``periodic`` row's worker state in a LoRA run: π_ref = `AdapterSnapshot`, no reference engine."""

    row = modes.REFERENCES["periodic"]
    lora_snapshot = True

    def __init__(self, schedule: RefreshSchedule, actor: Any):
        super().__init__(schedule, actor, None)
        self.snapshot = AdapterSnapshot()

    @classmethod
    def from_settings(cls, settings: Any, actor: Any, ref: Any = None) -> "LoraPeriodicReference":
        schedule = RefreshSchedule(settings.ref_refresh_steps, settings.ref_refresh_kl, settings.ref_kl_ema)
        return cls(schedule, actor)

    def modules(self) -> tuple[torch.nn.Module, Optional[torch.nn.Module]]:
        return engine_module(self.actor, "actor"), None

    @contextlib.contextmanager
    def reference_pass(self) -> Iterator[None]:
        """verl's reference pass with the snapshot in the adapter (taken now at the first pass: the initial
        adapter), the policy's adapter restored after it."""
        module = engine_module(self.actor, "actor")
        if not self.snapshot.taken:
            self.snapshot.take(module)
        with self.snapshot.swapped(module):
            yield

    def write(self, actor: torch.nn.Module, ref: Optional[torch.nn.Module]) -> None:
        self.snapshot.take(actor)

    def verify(self, actor: torch.nn.Module, ref: Optional[torch.nn.Module], before: Any) -> None:
        n, checksum = self.snapshot.verify(actor)
        step = self.schedule.state.history[-1]["train_step"]
        print(
            f"[rpg.reference] rank {rank()}: LoRA reference = policy adapter after the refresh at training step "
            f"{step} ({n} shard tensors equal, checksum {checksum:.9e})",
            flush=True,
        )

    # checkpoints: the snapshot in ref_model/ (rpg.reference.written)
    def has_ref_weights(self) -> bool:
        return self.snapshot.taken

    def ref_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.snapshot.tensors)

    def load_ref_state_dict(self, load: Any) -> None:
        """Load the snapshot with `load(state)` (torch.distributed.checkpoint into tensors of the adapter's layout)."""
        state = self.snapshot.template(engine_module(self.actor, "actor"))
        load(state)
        self.snapshot.tensors = state
