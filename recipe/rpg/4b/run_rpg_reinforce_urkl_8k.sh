#!/usr/bin/env bash
# RPG-REINFORCE-URKL — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "RPG-REINFORCE-URKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 8
preset_rpg_reinforce urkl 1e-4
rpg_run "$@"
