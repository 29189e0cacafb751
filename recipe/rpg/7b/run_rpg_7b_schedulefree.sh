#!/usr/bin/env bash
# RPG-UFKL with β = 0 (no KL) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
# The authors' script #40 (docs/differences.md#authors-scripts); not reported in the paper.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b math
preset_rpg ufkl 0
OPTIM=schedulefree
rpg_run "$@"
