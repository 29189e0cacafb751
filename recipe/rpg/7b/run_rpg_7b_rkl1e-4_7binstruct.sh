#!/usr/bin/env bash
# RPG-RKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #28 (docs/differences.md#authors-scripts); Table 8 row "RPG-RKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_rpg rkl 1e-4
rpg_run "$@"
