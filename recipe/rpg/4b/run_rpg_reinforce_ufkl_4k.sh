#!/usr/bin/env bash
# RPG-REINFORCE-UFKL — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "RPG-REINFORCE-UFKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 4
preset_rpg_reinforce ufkl 1e-4
rpg_run "$@"
