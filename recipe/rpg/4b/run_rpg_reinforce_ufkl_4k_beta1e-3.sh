#!/usr/bin/env bash
# RPG-REINFORCE-UFKL with β = 1e-3 — Qwen3-4B, 4K context. Paper: Fig. 9 (KL-coefficient ablation;
# compare run_rpg_reinforce_ufkl_4k.sh with β = 1e-4).
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=ufkl recipe.beta=1e-3 "$@"
