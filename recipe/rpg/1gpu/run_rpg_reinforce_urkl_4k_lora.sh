#!/usr/bin/env bash
# RPG-REINFORCE-URKL with LoRA on one GPU — Qwen3-4B, 4K context. Not the paper's setting: the paper's row
# "RPG-REINFORCE-URKL" (Tables 5 and 7, Fig. 5; 4b/run_rpg_reinforce_urkl_4k.sh) trains every weight on 8 × H100. Same
# data, rewards, β, batch and evaluation; LoRA on every linear layer, rank 32, α = 32, learning rate 1e-5 = 10 × the
# row's 1e-6 (LoRA Without Regret, Schulman et al., Thinking Machines Lab, 2025; rpg/config/setup/lora_1gpu.yaml).
# Fits one 80 GB GPU by the memory plan (docs/gpu.md#lora). Projected wall time on one GPU: 263-819 hours, 11-34 days,
# 5-19 days of it validation (recipe/rpg/README.md#one-gpu).
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k_lora method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4 "$@"
