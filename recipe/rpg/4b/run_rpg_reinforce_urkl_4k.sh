#!/usr/bin/env bash
# RPG-REINFORCE-URKL — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "RPG-REINFORCE-URKL".
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4 "$@"
