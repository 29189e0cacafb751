#!/usr/bin/env bash
# REINFORCE++ — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #10 (docs/differences.md#authors-scripts); Table 8 row "REINFORCE++".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_reinforce_pp
rpg_run "$@"
