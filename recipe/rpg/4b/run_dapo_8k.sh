#!/usr/bin/env bash
# DAPO — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "DAPO".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 8
preset_dapo
rpg_run "$@"
