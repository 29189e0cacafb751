#!/usr/bin/env bash
# GRPO — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "GRPO".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 2
preset_grpo
rpg_run "$@"
