#!/usr/bin/env bash
# GRPO (k3 KL loss against the frozen initial model, beta=1e-3)
# on the tiny CPU task (profile=cpu: sizes and machine in rpg/config/profile/cpu.yaml). Build the model first:
# .venv/bin/python -m rpg.tools.tiny_model. Extra arguments are Hydra overrides.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" profile=cpu method=grpo "$@"
