#!/usr/bin/env bash
# RPG-REINFORCE-FKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #22 (docs/differences.md#authors-scripts); Table 8 row "RPG-REINFORCE-FKL".
# The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
# Algorithm 2 with the stated β = 1e-4, as the paper describes.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_rpg_reinforce fkl 1e-4
LR=5e-7; TOKEN_LEN_FACTOR=4   # the authors' REINFORCE scripts (docs/differences.md#d14)
rpg_run "$@"
