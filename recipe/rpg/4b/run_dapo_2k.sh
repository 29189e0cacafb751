#!/usr/bin/env bash
# DAPO — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "DAPO".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 2
preset_dapo
rpg_run "$@"
