#!/usr/bin/env bash
# REINFORCE++-Baseline — Qwen2.5-Math-7B, 2K context.
# The authors' script #13 (docs/differences.md#authors-scripts); not reported in the paper.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_math method=reinforce_pp_baseline "$@"
