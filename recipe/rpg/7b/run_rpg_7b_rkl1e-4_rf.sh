#!/usr/bin/env bash
# RPG-REINFORCE-RKL, hard clip, no dual clip (the authors' `rpg_rf_rkl`) — Qwen2.5-Math-7B, 2K context.
# The authors' script #29 (docs/differences.md#authors-scripts); not reported in the paper.
# Hard clip: docs/differences.md#d6. The authors passed this KL through verl's in-reward path, which trained with a
# length penalty of −1e-4 per token instead of the RKL estimator (docs/differences.md#d2); here the KL is in the loss.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=authors_7b_math method=rpg_reinforce_hardclip recipe.divergence=rkl recipe.beta=1e-4 actor_rollout_ref.actor.optim.lr=5e-7 "$@"
