#!/usr/bin/env bash
# DAPO — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "DAPO".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 4
preset_dapo
rpg_run "$@"
