#!/usr/bin/env bash
# GRPO — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
# The authors' script #7 (docs/differences.md#authors-scripts); not reported in the paper.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_math method=grpo optim=schedulefree "$@"
