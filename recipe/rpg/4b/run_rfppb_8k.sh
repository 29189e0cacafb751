#!/usr/bin/env bash
# REINFORCE++-Baseline — Qwen3-4B, 8K context. Paper: not in the paper's tables at this context.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_8k method=reinforce_pp_baseline "$@"
