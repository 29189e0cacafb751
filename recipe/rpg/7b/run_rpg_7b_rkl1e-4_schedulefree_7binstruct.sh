#!/usr/bin/env bash
# RPG-RKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
# The authors' script #39 (docs/differences.md#authors-scripts); not reported in the paper.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_rpg rkl 1e-4
OPTIM=schedulefree
rpg_run "$@"
