#!/usr/bin/env bash
# REINFORCE++ — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
# The authors' script #12 (docs/differences.md#authors-scripts); not reported in the paper.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_reinforce_pp
OPTIM=schedulefree
rpg_run "$@"
