#!/usr/bin/env bash
# RPG-URKL with the top-k KL — Qwen3-4B, 4K context. Not a paper row: the pair of run_rpg_urkl_4k.sh (Tables 5 and 7,
# row "RPG-URKL", the sampled estimator) at the paper's β = 1e-4, with the per-token KL computed from the logits on
# π_old's 64 most probable tokens plus the sampled tail (unbiased; docs/losses.md#topk-kl). Costs 512 bytes per token
# between the old-log-prob pass and the update and one more logits gradient in the backward (the memory plan counts
# both). Not trained at this scale yet.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg recipe.divergence=urkl recipe.beta=1e-4 actor_rollout_ref.actor.policy_loss.kl_estimator=topk actor_rollout_ref.actor.policy_loss.kl_topk=64 actor_rollout_ref.actor.policy_loss.kl_topk_tail=sampled "$@"
