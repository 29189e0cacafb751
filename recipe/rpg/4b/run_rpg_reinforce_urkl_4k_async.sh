#!/usr/bin/env bash
# RPG-REINFORCE-URKL — Qwen3-4B, 4K context, asynchronous: the paper's best configuration (Tables 5 and 7, row
# "RPG-REINFORCE-URKL", as run_rpg_reinforce_urkl_4k.sh) on verl's colocated asynchronous trainer. Not a paper row:
# the paper trains synchronously. Generation runs one batch ahead of the update, so samples are up to a version stale
# (μ ≠ π_old); π_old is recomputed by the actor and token-level TIS weights v̄ = min(π_old/μ, 2) correct the measure
# (docs/async.md#modes, docs/async.md#truncation). TRAINER_MODE in the environment wins (sync gives the paper's run
# plus TIS weights); OLD_LOGPROB=rollout is refused here, since bypass mode would ignore the TIS weights.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4 trainer.v1.trainer_mode=colocate_async algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0 "$@"
