#!/usr/bin/env bash
# GRPO — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "GRPO".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 8
preset_grpo
rpg_run "$@"
