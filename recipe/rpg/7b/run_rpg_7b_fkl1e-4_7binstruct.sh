#!/usr/bin/env bash
# RPG-FKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #18 (docs/differences.md#authors-scripts); Table 8 row "RPG-FKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_rpg fkl 1e-4
rpg_run "$@"
