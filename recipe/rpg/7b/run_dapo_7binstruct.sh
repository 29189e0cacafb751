#!/usr/bin/env bash
# DAPO — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #4 (docs/differences.md#authors-scripts); Table 8 row "DAPO".
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_authors_7b instruct
preset_dapo
rpg_run "$@"
