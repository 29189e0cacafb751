#!/usr/bin/env bash
# RPG-REINFORCE-URKL with an EMA (Polyak) reference — Qwen3-4B, 4K context. Not a paper row: π_ref ← τ·π_ref +
# (1 − τ)·π_θ after every P optimizer steps (EMA-PG, arXiv 2602.04417; docs/reference-modes.md#ema), τ = 0.99 and
# P = 16 (one training step) here; τ = 0 is the periodic reference, τ → 1 the frozen one. Set REF_EMA_DECAY /
# REF_EMA_PERIOD in the environment. No value was tuned at this scale.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4 actor_rollout_ref.actor.policy_loss.reference=ema actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.0 actor_rollout_ref.actor.policy_loss.ref_ema_decay=0.99 actor_rollout_ref.actor.policy_loss.ref_ema_period=16 "$@"
