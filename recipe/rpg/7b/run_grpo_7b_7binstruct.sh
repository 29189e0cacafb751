#!/usr/bin/env bash
# GRPO — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #6 (docs/differences.md#authors-scripts); Table 8 row "GRPO".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_grpo
rpg_run "$@"
