#!/usr/bin/env bash
# DAPO — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "DAPO".
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_8k method=dapo "$@"
