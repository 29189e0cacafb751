#!/usr/bin/env bash
# GSPO + RPG's URKL — Qwen3-4B, 4K context. Not a paper row: verl's GSPO loss (sequence-level ratio, clip
# (3e-4, 4e-4), seq-mean-token-mean) with the URKL regulariser added at the token ratio, β = 1e-4, iterative reference
# (docs/losses.md#kl-addon). Its KL term is aggregated with the constant denominator B·loss_scale_factor (4096, the
# maximum response length), not GSPO's seq-mean-token-mean: exact, and β per token is scaled by the mean response
# length over 4096 against a token-mean run (docs/losses.md#kl-aggregation). Dynamic sampling and the overlong penalty
# as every recipe here.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_kl recipe.divergence=urkl recipe.beta=1e-4 recipe.base=gspo actor_rollout_ref.actor.clip_ratio_low=3e-4 actor_rollout_ref.actor.clip_ratio_high=4e-4 actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean actor_rollout_ref.actor.loss_scale_factor=4096 "$@"
