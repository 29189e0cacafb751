#!/usr/bin/env bash
# GRPO — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
# The authors' script #7 (docs/differences.md#authors-scripts); not reported in the paper.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b math
preset_grpo
OPTIM=schedulefree
rpg_run "$@"
