#!/usr/bin/env bash
# RPG-RKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
# The authors' script #27 (docs/differences.md#authors-scripts); not reported in the paper.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_math method=rpg recipe.divergence=rkl recipe.beta=1e-4 "$@"
