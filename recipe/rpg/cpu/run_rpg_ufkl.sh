#!/usr/bin/env bash
# RPG-UFKL (fully differentiable, Algorithm 1, beta=1e-4, iterative reference)
# on the tiny CPU task (profile=cpu: sizes and machine in rpg/config/profile/cpu.yaml). Build the model first:
# .venv/bin/python -m rpg.tools.tiny_model. Extra arguments are Hydra overrides.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" profile=cpu method=rpg recipe.divergence=ufkl recipe.beta=1e-4 "$@"
