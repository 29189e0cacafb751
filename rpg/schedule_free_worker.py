"""The schedule-free actor worker: verl's `ActorRolloutRefWorker` with the actor's two parameter sets managed
(docs/schedule-free.md; the parameter sets and the table of which set is loaded when: `rpg.schedule_free`).

One new remote method (`set_schedule_free_weights`, called by the trainer around validation) and three extended ones
(`init_model`, `save_checkpoint`: the training state at y and the ``huggingface/`` export at x, `load_checkpoint`).
The trainer (`rpg.schedule_free_trainer`) puts this class in place of verl's for the actor role. A Ray worker of a
schedule-free run imports this module first, to unpickle the class.
"""

from __future__ import annotations

import os
from typing import Optional

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from rpg.schedule_free import ITERATE, WEIGHT_SETS, ScheduleFreeIterates, is_schedule_free

__all__ = ["ScheduleFreeActorRolloutRefWorker"]


class ScheduleFreeActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's `ActorRolloutRefWorker`, with the actor's schedule-free parameter sets managed (module docstring).

    With a non-schedule-free optimizer every addition is a no-op, so the class is safe for any actor.
    """

    _schedule_free: Optional[ScheduleFreeIterates] = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        optimizer = getattr(getattr(self.actor, "engine", None), "optimizer", None) if self.actor else None
        if is_schedule_free(optimizer):
            self._schedule_free = ScheduleFreeIterates(optimizer)
            self._schedule_free.use_iterate()  # schedulefree starts in eval mode; before any step this only sets flags

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_schedule_free_weights(self, weights: str) -> bool:
        """Load the actor's `ITERATE` (y) or `AVERAGE` (x) parameters. Returns True if they changed (then the rollout
        servers need `update_weights`). False without a schedule-free optimizer."""
        if weights not in WEIGHT_SETS:
            raise ValueError(f"schedule-free weights must be one of {list(WEIGHT_SETS)}, got {weights!r}")
        if self._schedule_free is None:
            return False
        return self._schedule_free.use(weights)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        """Training state at y (exact resume); the ``huggingface/`` export, if configured, at x."""
        sf = self._schedule_free
        if sf is None:
            return super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
        if sf.current != ITERATE:
            raise RuntimeError("save_checkpoint called while the schedule-free average x is loaded; expected y")
        manager = self.actor.engine.checkpoint_manager
        contents = list(manager.checkpoint_save_contents)
        try:
            manager.checkpoint_save_contents = [c for c in contents if c != "hf_model"]
            super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
            if "hf_model" in contents:
                manager.checkpoint_save_contents = ["hf_model"]
                registered = list(manager.previous_saved_paths)
                with sf.average():
                    # max_ckpt_to_keep=None: this second pass must not rotate (it would delete local_path)
                    self.actor.save_checkpoint(local_path, None, global_step, None)
                manager.previous_saved_paths = registered  # the folder was registered once, by the first pass
                if self.rank == 0:
                    print(f"[rpg.schedule_free] HF export of the average x at step {global_step}: "
                          f"{os.path.join(local_path, 'huggingface')} (training state at y)", flush=True)
        finally:
            manager.checkpoint_save_contents = contents

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
        if self._schedule_free is not None:
            self._schedule_free.after_load()
