#!/usr/bin/env bash
# RPG-UFKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #42 (docs/differences.md#authors-scripts); Table 8 row "RPG-UFKL".
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_instruct method=rpg recipe.divergence=ufkl recipe.beta=1e-4 "$@"
