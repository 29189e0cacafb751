#!/usr/bin/env bash
# RPG-FKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
# The authors' script #25 (docs/differences.md#authors-scripts); not reported in the paper.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b math
preset_rpg fkl 1e-4
OPTIM=schedulefree
rpg_run "$@"
