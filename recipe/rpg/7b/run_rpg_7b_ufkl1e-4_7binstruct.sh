#!/usr/bin/env bash
# RPG-UFKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #42 (docs/differences.md#authors-scripts); Table 8 row "RPG-UFKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_rpg ufkl 1e-4
rpg_run "$@"
