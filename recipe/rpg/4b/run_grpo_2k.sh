#!/usr/bin/env bash
# GRPO — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "GRPO".
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_2k method=grpo "$@"
