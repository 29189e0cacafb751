"""Free disk for the checkpoints a run will save (`trainer.default_local_dir`, the recipes' CKPTS_DIR), before launch.

A 7B checkpoint with AdamW's states is about 91 GB, and the first one is written at step `save_freq` (20): a disk that
cannot hold it fails the run hours in. The estimate, from the model's parameter count P (`rpg.preflight.memory`:
the config.json on disk or in the HF cache, or the shipped table of the recipe models):

* actor weights (`save_contents` has `model`): P × the FSDP model dtype's bytes (fp32: 4);
* optimizer states (`optimizer`): P × 4 bytes × the optimizer's fp32 states (AdamW, schedule-free: 2);
* the HF export (`hf_model`): P × the model dtype's bytes;
* the reference weights a mode that writes them saves next to the actor's (`rpg.modes.checkpoint_bytes`: periodic,
  EMA): P × the reference's FSDP model dtype's bytes (fp32 for EMA);
* under LoRA (`rpg.preflight.lora_config`) the trained parameters are the adapter's A (`rpg.preflight.memory`'s count
  for the rank and target modules): the optimizer states are A × 4 bytes × states, the actor weights are the whole
  model (A only with ``checkpoint.save_lora_only=True``), and the periodic reference's adapter snapshot is A × 4 bytes
  (fp32; docs/reference-modes.md#lora);

times the checkpoints on disk at once: verl writes a new one before it deletes the oldest, so
`max_actor_ckpt_to_keep` + 1 (or every save of the run when nothing is deleted). A launch that saves refuses when the
disk holding the folder has less free space, with the numbers and the fix; a dry run prints the same as a warning.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from rpg import modes
from rpg.modes import checkpoint_bytes
from rpg.preflight.lora_config import LoraSettings, lora_settings
from rpg.preflight.memory import DTYPE_BYTES, load_model_shape, lora_modules, optimizer_states
from rpg.preflight.verl_configs import ValidatedConfig
from rpg.reference.lora_modes import lora_reference

GB = 1e9


@dataclasses.dataclass(frozen=True)
class CheckpointEstimate:
    parts: dict[str, float]  # bytes of one checkpoint, by part
    copies: int  # checkpoints on disk at once
    why: str  # where `copies` comes from

    @property
    def one(self) -> float:
        return sum(self.parts.values())

    @property
    def needed(self) -> float:
        return self.one * self.copies


def _dtype_bytes(fsdp: Any) -> int:
    """Bytes per parameter of an FSDP engine's `model_dtype` (4 for a dtype the table lacks)."""
    return DTYPE_BYTES.get(str(fsdp.model_dtype).lower().replace("torch.", ""), 4)


def saves(trainer: Any) -> int:
    """Checkpoints a run with these `trainer` settings writes (0: none). verl saves every `save_freq` steps and after
    the last step."""
    freq, total = int(trainer.save_freq or -1), trainer.total_training_steps
    if freq <= 0:
        return 0
    if total is None:
        return 1  # unknown length: at least one
    return len({s for s in range(1, int(total) + 1) if s % freq == 0 or s == int(total)})


def _adapter_params(model: Any, lora: LoraSettings) -> int:
    """The LoRA adapter's parameter count (A and B of every adapted layer) of the run's model."""
    shape = load_model_shape(str(model.path), model.hf_config_path)
    return shape.lora_params(lora.rank, lora_modules(lora.target_modules))


def _lora_snapshot(settings: Any, adapter: int) -> dict[str, float]:
    """The adapter snapshot a LoRA reference mode saves next to the actor's checkpoint (fp32), by part."""
    if settings is None:
        return {}
    row, _ = modes.selected(settings)
    return {f"{row.name} reference adapter snapshot": float(adapter) * 4} if lora_reference(row.name).snapshot else {}


def estimate(validated: ValidatedConfig, n_params: Optional[int] = None) -> CheckpointEstimate:
    """The checkpoints of a validated run; `n_params`: the model's parameter count (default: from its shape,
    `rpg.preflight.memory.load_model_shape`)."""
    config, actor = validated.config, validated.actor
    model = config.actor_rollout_ref.model
    if n_params is None:
        n_params = load_model_shape(str(model.path), model.hf_config_path).param_count()
    lora = lora_settings(config)
    trained = _adapter_params(model, lora) if lora.rank > 0 else n_params  # the optimizer's parameters
    contents = list(actor.checkpoint.save_contents)
    weight = _dtype_bytes(actor.fsdp_config)
    parts: dict[str, float] = {}
    if "model" in contents:
        lora_only = lora.rank > 0 and bool(getattr(actor.checkpoint, "save_lora_only", False))
        parts["actor weights"] = (trained if lora_only else n_params) * weight
    if "optimizer" in contents:
        states, _ = optimizer_states(str(actor.optim.optimizer))
        parts[f"optimizer states ({states} fp32 per parameter)"] = trained * 4 * states
    if "hf_model" in contents:
        parts["HF export"] = n_params * weight
    # rpg_reference/ next to the actor's checkpoint
    if lora.rank > 0:  # no reference engine: the reference is an adapter on the shared base
        parts.update(_lora_snapshot(validated.rpg, trained))
    elif validated.ref is not None:  # a mode that writes the reference weights runs with verl's reference model
        parts.update(checkpoint_bytes(validated.rpg, n_params, _dtype_bytes(validated.ref.fsdp_config)))
    trainer = config.trainer
    n, keep = saves(trainer), trainer.max_actor_ckpt_to_keep
    if keep is not None and int(keep) > 0 and int(keep) < n:
        copies, why = int(keep) + 1, f"trainer.max_actor_ckpt_to_keep={keep} + 1 being written"
    else:
        copies, why = n, f"every one of the run's {n} saves is kept"
    return CheckpointEstimate(parts, max(copies, 1), why)


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def problem(validated: ValidatedConfig, free_bytes: Optional[float] = None) -> Optional[str]:
    """Why the checkpoint folder cannot hold the validated run's checkpoints, or None (also when the run saves none, or
    when the model's shape is unknown: a remote model without a cached config.json, which the GPU memory plan
    reports)."""
    trainer = validated.config.trainer
    if saves(trainer) == 0:
        return None
    folder = Path(os.path.expanduser(str(trainer.default_local_dir))).resolve()
    try:
        est = estimate(validated)
    except ValueError:
        return None
    free = shutil.disk_usage(_existing(folder)).free if free_bytes is None else free_bytes
    if free >= est.needed:
        return None
    return _refusal(folder, free, est)


def _refusal(folder: Path, free: float, est: CheckpointEstimate) -> str:
    """The refusal's text: the numbers, the parts, and the fixes (a smaller keep only where it changes something)."""
    parts = " + ".join(f"{k} {v / GB:.1f} GB" for k, v in est.parts.items())
    fewer = ""
    if est.copies > 2:
        fewer = f", keep fewer checkpoints (trainer.max_actor_ckpt_to_keep=1: {2 * est.one / GB:.0f} GB)"
    return (f"the checkpoint folder trainer.default_local_dir={folder} (CKPTS_DIR) has {free / GB:.1f} GB free, and "
            f"the run's checkpoints need about {est.needed / GB:.1f} GB: {est.copies} × ({parts}) ({est.why}). Set "
            f"CKPTS_DIR to a disk with at least {est.needed / GB:.0f} GB free (on several nodes, a shared one)"
            f"{fewer}, or save none (trainer.save_freq=-1)")
