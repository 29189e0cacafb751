#!/usr/bin/env bash
# RPG-REINFORCE-UFKL — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "RPG-REINFORCE-UFKL".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 8
preset_rpg_reinforce ufkl 1e-4
rpg_run "$@"
