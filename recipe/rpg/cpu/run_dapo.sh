#!/usr/bin/env bash
# DAPO (clip-higher, dynamic sampling, overlong penalty, no KL) on the tiny CPU task (RPG_PROFILE=cpu: sizes and machine in recipe/rpg/cpu/profile.sh).
# Build the model first: .venv/bin/python -m rpg.tools.tiny_model. Extra arguments are Hydra overrides.
RPG_PROFILE=cpu
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
preset_dapo
rpg_run "$@"
