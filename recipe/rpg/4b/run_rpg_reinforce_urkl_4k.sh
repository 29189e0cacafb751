#!/usr/bin/env bash
# RPG-REINFORCE-URKL — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "RPG-REINFORCE-URKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 4
preset_rpg_reinforce urkl 1e-4
rpg_run "$@"
