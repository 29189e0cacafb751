#!/usr/bin/env bash
# DAPO — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
# The authors' script #2 (docs/differences.md#authors-scripts); not reported in the paper.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b math
preset_dapo
OPTIM=schedulefree
rpg_run "$@"
