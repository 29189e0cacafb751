#!/usr/bin/env bash
# GRPO (k3 KL loss against the frozen initial model, beta=1e-3) on the tiny CPU task (RPG_PROFILE=cpu: sizes and machine in recipe/rpg/cpu/profile.sh).
# Build the model first: .venv/bin/python -m rpg.tools.tiny_model. Extra arguments are Hydra overrides.
RPG_PROFILE=cpu
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
preset_grpo
rpg_run "$@"
