#!/usr/bin/env bash
# REINFORCE++-Baseline — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #14 (docs/differences.md#authors-scripts); Table 8 row "REINFORCE++-Baseline".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_reinforce_pp_baseline
rpg_run "$@"
