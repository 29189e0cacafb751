"""The schedule-free trainer: verl's synchronous v1 trainer whose validation samples with the average x
(docs/schedule-free.md; `rpg.schedule_free`).

`ScheduleFreeSyncTrainer` is registered in verl's trainer registry as ``trainer.v1.trainer_mode=schedule_free_sync``
by the table of patch points (`rpg.patches`, ``RPG_INSTALL=schedule_free``). It uses verl's own validation hooks
(``on_validate_begin``/``on_validate_end``) to switch the actor to x and back, re-syncing the rollout servers, and puts
`rpg.schedule_free_worker.ScheduleFreeActorRolloutRefWorker` in place of verl's actor worker.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.trainer.ppo.v1 import PPOTrainerSync
from verl.workers.engine_workers import ActorRolloutRefWorker

from rpg.schedule_free import AVERAGE, ITERATE

__all__ = ["ScheduleFreeSyncTrainer"]


class ScheduleFreeSyncTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer; validation samples with the schedule-free average x (module docstring)."""

    @property
    def trainer_mode(self) -> str:
        # verl's base class branches on `self.trainer_mode == "sync"` (replay buffer, TransferQueue checkpointing);
        # this trainer *is* the sync trainer, registered under another name.
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:  # PPOTrainer.__init__ assigns the registry name; keep "sync"
        pass

    def _init_resource_pool_mgr(self):
        # imported here, not at the top: a Ray worker imports the worker module first, and its `import verl`
        # registers this trainer (rpg.patches), which must then not need the half-imported worker module
        from rpg.schedule_free_worker import ScheduleFreeActorRolloutRefWorker

        super()._init_resource_pool_mgr()
        for role, cls in list(self.role_worker_mapping.items()):
            if _remote_class(cls) is ActorRolloutRefWorker:
                self.role_worker_mapping[role] = ray.remote(ScheduleFreeActorRolloutRefWorker)

    def _use_weights(self, weights: str) -> None:
        if any(self.actor_rollout_wg.set_schedule_free_weights(weights)):
            self.checkpoint_manager.sleep_replicas()
            self.checkpoint_manager.update_weights(self.global_steps)

    def on_validate_begin(self):
        super().on_validate_begin()
        self._use_weights(AVERAGE)

    def on_validate_end(self):
        self._use_weights(ITERATE)
        super().on_validate_end()


def _remote_class(actor_cls: Any) -> Any:
    """The user class behind ``ray.remote(cls)``."""
    return getattr(actor_cls, "__ray_actor_class__", None)
