#!/usr/bin/env bash
# DAPO — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #4 (docs/differences.md#authors-scripts); Table 8 row "DAPO".
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_instruct method=dapo "$@"
