#!/usr/bin/env bash
# RPG-REINFORCE-URKL with an adaptive β — Qwen3-4B, 4K context. Not a paper row: β starts at 1e-4 and follows the
# proportional controller of Ziegler et al. 2019 towards a target of actor/rpg/kl (here the KL to π_old, the policy's
# drift within a training step; docs/losses.md#adaptive-beta), horizon H = 10 training steps. The target 1e-3 nats per
# token is a starting point, not a measured value: set KL_TARGET / KL_HORIZON in the environment.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4 actor_rollout_ref.actor.policy_loss.kl_control=adaptive actor_rollout_ref.actor.policy_loss.kl_target=1e-3 actor_rollout_ref.actor.policy_loss.kl_horizon=10 "$@"
