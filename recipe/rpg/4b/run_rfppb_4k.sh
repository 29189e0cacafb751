#!/usr/bin/env bash
# REINFORCE++-Baseline — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "REINFORCE++-Baseline".
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=reinforce_pp_baseline "$@"
