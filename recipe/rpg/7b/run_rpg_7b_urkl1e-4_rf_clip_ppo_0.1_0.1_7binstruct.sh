#!/usr/bin/env bash
# RPG-REINFORCE-URKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
# The authors' script #53 (docs/differences.md#authors-scripts); not reported in the paper.
# The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
# Algorithm 2 with the stated β = 1e-4, as the paper describes.
# Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_instruct method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4 actor_rollout_ref.actor.clip_ratio_low=0.1 actor_rollout_ref.actor.clip_ratio_high=0.1 actor_rollout_ref.actor.optim.lr=5e-7 recipe.token_len_factor=4 "$@"
