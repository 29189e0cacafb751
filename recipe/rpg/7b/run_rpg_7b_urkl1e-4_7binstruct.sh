#!/usr/bin/env bash
# RPG-URKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #52 (docs/differences.md#authors-scripts); Table 8 row "RPG-URKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_rpg urkl 1e-4
rpg_run "$@"
