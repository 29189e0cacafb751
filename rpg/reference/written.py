"""What the reference modes that write the reference engine's weights share (the rows of `rpg.modes` with
``writes_reference``: periodic, ema): the schedule, the count of the actor's optimizer steps, the timed write at the
end of a training step, and the checkpoint of the reference state.

``save``/``load`` (the ``save_checkpoint``/``load_checkpoint`` hooks): next to verl's actor checkpoint
(``global_step_N/actor/``) ``rpg_reference/state.json`` stores the schedule (steps since the last write, KL EMA,
history) and, once the reference has been written, ``rpg_reference/ref_model/`` stores the reference weights
(torch.distributed.checkpoint format). Both are written atomically (temp + rename). A resumed run therefore uses the
same reference and writes it at exactly the same steps as an uninterrupted one. They are read *before* verl's own
load, which may delete the local checkpoint. A checkpoint without this state (saved with another reference mode), a
corrupt state file or a non-finite KL average is refused, naming the file: silently restarting from the initial model
would break the resume promise; so is a state whose ``has_ref_weights`` names a ``ref_model/`` that is missing. The
per-mode write, its SMOKE=1 check and its metrics are the subclasses' (`rpg.reference.periodic`, `rpg.reference.ema`,
`rpg.reference.lora`). Under LoRA (`rpg.reference.lora.LoraPeriodicReference`) ``ref_model/`` holds the snapshot of
the policy's adapter, ``state.json`` records ``lora_snapshot: true``, and a checkpoint without the snapshot is refused
(never resumed from the policy's adapter); a LoRA state is never loaded into a full-weight run, nor the reverse.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from typing import Any, Optional

import torch

from rpg.atomic import atomic_write_json
from rpg import modes
from rpg.reference.ranks import barrier, dist_ready, rank, reject_constant
from rpg.reference.schedule import RefreshSchedule
from rpg.reference.step import TrainingStep
from rpg.reference.weights import engine_module, reshard_fsdp2

__all__ = ["WrittenReference"]

# the checkpoint's names (rpg.preflight.resume_ckpt reads them from here to check a resume before launch)
STATE_DIR = "rpg_reference"
STATE_FILE = "state.json"
REF_MODEL_DIR = "ref_model"
REF_MODEL_INDEX = ".metadata"  # the index file torch.distributed.checkpoint writes into REF_MODEL_DIR
HAS_REF_WEIGHTS = "has_ref_weights"  # the state's key: REF_MODEL_DIR was written
LORA_SNAPSHOT = "lora_snapshot"  # the state's key: REF_MODEL_DIR holds a LoRA adapter snapshot (rpg.reference.lora)
STATE_VERSION = 1


class WrittenReference:
    """Per-worker state of a mode that writes the reference weights on a `RefreshSchedule`.

    ``actor`` / ``ref`` are verl ``TrainingWorker`` objects (``ActorRolloutRefWorker.actor`` / ``.ref``). Subclasses
    set ``row`` and implement `write` (and may override `verify` and `metrics`).
    """

    row: modes.Mode
    lora_snapshot = False  # the reference is a snapshot of the policy's LoRA adapter (rpg.reference.lora)

    def __init__(self, schedule: RefreshSchedule, actor: Any, ref: Any):
        self.schedule = schedule
        self.actor = actor
        self.ref = ref
        self.optimizer_steps = 0  # optimizer steps of the actor engine since the counter was last reset
        self.last_write_s = 0.0
        self._count_optimizer_steps(actor.engine)

    @property
    def mode(self) -> str:
        return self.row.name

    def _count_optimizer_steps(self, engine: Any) -> None:
        """Count the actor engine's real optimizer steps (verl's ``BaseEngine.optimizer_step``, one per mini-batch,
        whatever the batch format or the mini-batch/epoch settings) with an instance-level wrapper."""
        step = engine.optimizer_step

        @functools.wraps(step)
        def optimizer_step(*args, **kwargs):
            self.optimizer_steps += 1
            return step(*args, **kwargs)

        engine.optimizer_step = optimizer_step

    # the training step ----------------------------------------------------------------------------------------------
    def start_step(self, step: TrainingStep) -> None:
        self.optimizer_steps = 0
        step.measure_ref_kl = True

    def write(self, actor: torch.nn.Module, ref: torch.nn.Module) -> None:
        raise NotImplementedError

    def verify(self, actor: torch.nn.Module, ref: torch.nn.Module, before: Any) -> None:
        """SMOKE=1 (`modes.VERIFY_ENV`): check the write on this rank, RuntimeError if wrong (the subclasses)."""

    def end_step(self, ref_kl: Optional[float], loss_kl: Optional[float]) -> dict[str, float]:
        """Update the schedule with this step's optimizer steps and reference KL, write the reference if due, and
        return the metrics of this step (without the ``actor/rpg/`` prefix)."""
        written = self.schedule.update(ref_kl, self.optimizer_steps)
        self.last_write_s = 0.0
        if written:
            actor, ref = self.modules()
            check = os.environ.get(modes.VERIFY_ENV) == "1"
            before = self.before_write(actor, ref) if check else None
            start = time.perf_counter()
            self.write(actor, ref)
            self.last_write_s = time.perf_counter() - start
            if check:
                self.verify(actor, ref, before)
        return self.metrics(written, ref_kl)

    def modules(self) -> tuple[torch.nn.Module, Optional[torch.nn.Module]]:
        """The actor's and the reference's torch modules (the LoRA snapshot has no reference module)."""
        return engine_module(self.actor, "actor"), engine_module(self.ref, "reference")

    def before_write(self, actor: torch.nn.Module, ref: torch.nn.Module) -> Any:
        """What `verify` needs from before the write (the subclasses)."""
        return None

    def metrics(self, written: bool, ref_kl: Optional[float]) -> dict[str, float]:
        raise NotImplementedError

    # checkpoints ------------------------------------------------------------------------------------------------------
    def save(self, local_path: str, global_step: int) -> None:
        """Write ``<local_path>/rpg_reference/{state.json, ref_model/}`` (all ranks call; rank 0 writes the JSON)."""
        root = os.path.join(local_path, STATE_DIR)
        has_weights = self.has_ref_weights()
        if has_weights:
            self._save_ref_weights(os.path.join(root, REF_MODEL_DIR))
        if rank() == 0:
            payload = {
                "version": STATE_VERSION,
                "reference": self.mode,
                "global_step": int(global_step),
                HAS_REF_WEIGHTS: has_weights,
                LORA_SNAPSHOT: self.lora_snapshot,
                "schedule": self.schedule.state_dict(),
            }
            atomic_write_json(os.path.join(root, STATE_FILE), payload, indent=2, sort_keys=True)
        barrier()

    def load(self, local_path: str) -> None:
        """Restore the schedule (and the written reference weights) saved by `save`.

        Raises RuntimeError when the checkpoint has no reference state (saved with another reference mode: resuming
        would silently restart the reference from the initial model), ValueError naming the file when it is corrupt.
        """
        root = os.path.join(local_path, STATE_DIR)
        path = os.path.join(root, STATE_FILE)
        if not os.path.exists(path):
            raise RuntimeError(
                f"reference={self.mode!r} cannot resume from {local_path}: it has no {path} (the checkpoint was saved "
                f"with another policy_loss.reference, or without rpg-verl), so the reference model and its refresh "
                f"schedule are unknown. Resume it with the reference= setting it was trained with, or start a new run "
                f"from its weights with trainer.resume_mode=disable (actor_rollout_ref.model.path=<exported model>)."
            )
        try:
            with open(path) as f:
                payload = json.load(f, parse_constant=reject_constant)
            if not isinstance(payload, dict) or payload.get("version") != STATE_VERSION:
                version = payload.get("version") if isinstance(payload, dict) else None
                raise ValueError(f"unsupported state version {version!r} (this rpg-verl reads {STATE_VERSION})")
            saved_mode = payload.get("reference", "periodic")  # files of rpg-verl before the EMA reference: periodic
            if saved_mode != self.mode:
                raise ValueError(
                    f"saved with reference={saved_mode!r}, resumed with reference={self.mode!r}: resume with the mode "
                    f"it was trained with, or start a new run from its weights (trainer.resume_mode=disable)"
                )
            self.schedule.load_state_dict(payload["schedule"])
            has_weights = payload[HAS_REF_WEIGHTS]
            if not isinstance(has_weights, bool):
                raise ValueError(f"{HAS_REF_WEIGHTS}={has_weights!r} must be true or false")
            saved_lora = payload.get(LORA_SNAPSHOT, False)  # files of rpg-verl before the LoRA reference: none
            if saved_lora is not self.lora_snapshot:
                raise ValueError(
                    f"saved {'with' if saved_lora else 'without'} LoRA ({LORA_SNAPSHOT}={saved_lora!r}), resumed "
                    f"{'with' if self.lora_snapshot else 'without'} it: the reference is "
                    f"{'an adapter snapshot' if saved_lora else 'a full model'} there. Resume with the LoRA settings "
                    "it was trained with, or start a new run (trainer.resume_mode=disable)"
                )
        except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"corrupt or mismatched {self.mode}-reference state {path}: {e}") from e
        weights = os.path.join(root, REF_MODEL_DIR)
        if self.lora_snapshot and not has_weights:
            raise RuntimeError(
                f"reference={self.mode!r} with LoRA cannot resume from {local_path}: {path} says no reference adapter "
                "was saved, and resuming would silently take the policy's adapter as the reference. Start a new run "
                "(trainer.resume_mode=disable) or resume from a checkpoint saved after the first training step"
            )
        if has_weights and not os.path.exists(os.path.join(weights, REF_MODEL_INDEX)):
            what = "reference adapter snapshot" if self.lora_snapshot else "reference weights"
            raise RuntimeError(
                f"reference={self.mode!r} cannot resume from {local_path}: {path} says the {what} were saved, but "
                f"{os.path.join(weights, REF_MODEL_INDEX)} is missing (an interrupted save or a partial copy); "
                "resuming would silently use the wrong reference. Resume from an older complete checkpoint, or start "
                "a new run (trainer.resume_mode=disable)"
            )
        if has_weights:
            self._load_ref_weights(weights)

    def has_ref_weights(self) -> bool:
        """Whether the reference differs from what a fresh worker builds (it was written at least once)."""
        return self.schedule.refresh_count > 0

    def ref_state_dict(self) -> dict[str, Any]:
        """What ``ref_model/`` holds: the reference engine's sharded state dict."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        module = engine_module(self.ref, "reference")
        reshard_fsdp2(module)
        return get_model_state_dict(module)

    def load_ref_state_dict(self, load: Any) -> None:
        """Load ``ref_model/`` with `load(state)` (torch.distributed.checkpoint) into the reference engine."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        module = engine_module(self.ref, "reference")
        reshard_fsdp2(module)
        state = get_model_state_dict(module)
        load(state)
        with torch.no_grad():
            set_model_state_dict(module, state)

    def _save_ref_weights(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp

        state = self.ref_state_dict()
        tmp = directory + ".tmp"
        if rank() == 0 and os.path.exists(tmp):
            shutil.rmtree(tmp)
        barrier()
        dcp.save(state, checkpoint_id=tmp, no_dist=not dist_ready())
        barrier()
        if rank() == 0:  # atomic switch: the complete directory appears under its final name or not at all
            if os.path.exists(directory):
                shutil.rmtree(directory)
            os.replace(tmp, directory)
        barrier()

    def _load_ref_weights(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp

        self.load_ref_state_dict(lambda state: dcp.load(state, checkpoint_id=directory, no_dist=not dist_ready()))
