#!/usr/bin/env bash
# REINFORCE++-Baseline — Qwen3-4B, 8K context. Paper: not in the paper's tables at this context.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 8
preset_reinforce_pp_baseline
rpg_run "$@"
