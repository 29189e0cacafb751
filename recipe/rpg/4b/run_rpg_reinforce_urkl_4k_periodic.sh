#!/usr/bin/env bash
# RPG-REINFORCE-URKL with the paper's periodic reference — Qwen3-4B, 4K context. Paper §5 "Iterative reference
# updates": π_ref ← π_θ every K optimizer steps or when a moving average of the token KL exceeds κ (no values given;
# the authors' code only refreshes every training step). K = 64 here = every 4 training steps (16 updates each);
# set REF_REFRESH_STEPS / REF_REFRESH_KL in the environment. Not a paper table row: the scheme the paper describes.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4 actor_rollout_ref.actor.policy_loss.reference=periodic actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.0 actor_rollout_ref.actor.policy_loss.ref_refresh_steps=64 "$@"
