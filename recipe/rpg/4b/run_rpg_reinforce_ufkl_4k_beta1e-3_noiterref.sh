#!/usr/bin/env bash
# RPG-REINFORCE-UFKL with β = 1e-3 and no iterative reference — Qwen3-4B, 4K context. Paper: Fig. 9 "noiterref".
# The KL reference is the frozen initial model: verl builds it (use_kl_loss=True) and adds no KL of its own
# (kl_loss_coef=0); the loss uses the ρ-weighted estimator of docs/losses.md#rho-weighting (the authors' code had none,
# docs/differences.md#d10).
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=ufkl recipe.beta=1e-3 actor_rollout_ref.actor.policy_loss.reference=frozen actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.0 "$@"
