#!/usr/bin/env bash
# RPG-REINFORCE-URKL with sequence-level KL credit — Qwen3-4B, 4K context. Not a paper row: token t's KL weight also
# credits the KL terms of the tokens after it, an estimate of the gradient of the KL between whole responses (Tang &
# Munos, arXiv 2506.09477; docs/losses.md#kl-credit) instead of the per-token one every paper number uses. Exact only
# with kl_ratio=raw and no clip active (and up to token-mean's O(1/B), docs/losses.md#kl-aggregation); this recipe keeps
# the default kl_ratio=clipped, C_KL at the clipped ratio (Remark F.2), the documented approximation.
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4 actor_rollout_ref.actor.policy_loss.kl_credit=sequence "$@"
