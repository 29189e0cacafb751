#!/usr/bin/env bash
# RPG-URKL — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "RPG-URKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 8
preset_rpg urkl 1e-4
rpg_run "$@"
