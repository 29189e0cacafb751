#!/usr/bin/env bash
# RPG-URKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
# The authors' script #60 (docs/differences.md#authors-scripts); not reported in the paper.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_instruct method=rpg recipe.divergence=urkl recipe.beta=1e-4 optim=schedulefree "$@"
