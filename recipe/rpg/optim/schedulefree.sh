# shellcheck shell=bash
# OPTIM=schedulefree: schedule-free AdamW for the actor (sourced by recipe/rpg/common.sh inside rpg_run).
#
# verl builds the optimizer from `optim.optimizer_impl` + `optim.optimizer` with common.sh's lr, weight_decay=0.1 and
# betas (0.9, 0.999); warm-up stays verl's LambdaLR (lr_warmup_steps=10, constant), AdamWScheduleFree's own
# warmup_steps keeps its default 0 — as in the authors' scripts (docs/schedule-free.md#settings).
# The trainer `schedule_free_sync` (verl's sync trainer + two hooks, rpg/schedule_free.py) keeps one parameter set per
# role: rollouts, old_log_prob and the update at the iterate y; validation and the HF export at the average x (fixes
# docs/differences.md#d16). The launcher has every process register that trainer (RPG_INSTALL, rpg/install.py).

RPG_OPTIM_OVERRIDES=(
  actor_rollout_ref.actor.optim.optimizer_impl=schedulefree
  actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFree
  trainer.use_v1=True
  trainer.v1.trainer_mode=schedule_free_sync
)
