#!/usr/bin/env bash
# REINFORCE++ — Qwen3-4B, 2K context. Paper: not in the paper's tables at this context.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 2
preset_reinforce_pp
rpg_run "$@"
