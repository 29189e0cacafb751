#!/usr/bin/env bash
# DAPO with LoRA on one GPU — Qwen3-4B, 2K context. Not the paper's setting: the paper's row "DAPO" (Table 6, Fig. 6;
# 4b/run_dapo_2k.sh) trains every weight on 8 × H100. Same data, rewards, batch and evaluation; LoRA on every linear
# layer, rank 32, α = 32, learning rate 1e-5 = 10 × the row's 1e-6 (LoRA Without Regret, Schulman et al., Thinking
# Machines Lab, 2025; rpg/config/setup/lora_1gpu.yaml). Fits one 80 GB GPU by the memory plan (docs/gpu.md#lora).
# Projected wall time on one GPU: 225-379 hours, 9-16 days (recipe/rpg/README.md#one-gpu).
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_2k_lora method=dapo "$@"
