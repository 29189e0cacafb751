#!/usr/bin/env bash
# RPG-URKL — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "RPG-URKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 2
preset_rpg urkl 1e-4
rpg_run "$@"
