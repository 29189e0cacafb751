#!/usr/bin/env bash
# RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
# The authors' script #33 (docs/differences.md#authors-scripts); not reported in the paper.
# The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
# Algorithm 2 with the stated β = 1e-4, as the paper describes.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_math method=rpg_reinforce recipe.divergence=rkl recipe.beta=1e-4 actor_rollout_ref.actor.optim.lr=5e-7 recipe.token_len_factor=4 "$@"
