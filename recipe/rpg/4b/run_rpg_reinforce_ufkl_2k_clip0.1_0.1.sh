#!/usr/bin/env bash
# RPG-REINFORCE-UFKL with clip (0.1, 0.1) — Qwen3-4B, 2K context. Paper: Fig. 8 (clip ablation;
# compare run_rpg_reinforce_ufkl_2k.sh with (0.2, 0.28)).
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_2k method=rpg_reinforce recipe.divergence=ufkl recipe.beta=1e-4 actor_rollout_ref.actor.clip_ratio_low=0.1 actor_rollout_ref.actor.clip_ratio_high=0.1 "$@"
