#!/usr/bin/env bash
# DAPO with LoRA on one GPU — Qwen3-1.7B, 2K context: the small-scale pair of
# run_rpg_reinforce_urkl_qwen3_1_7b_2k_lora.sh. Not the paper's setting: 128 prompts × 8 responses per step, 200 steps
# (rpg/config/setup/qwen3_1_7b_2k_lora.yaml says what the pair can and cannot show); LoRA on every linear layer, rank
# 32, α = 32, learning rate 1e-5 (LoRA Without Regret, Schulman et al., Thinking Machines Lab, 2025). Projected cost:
# 6-11 GPU-hours (recipe/rpg/README.md#one-gpu).
# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this file.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_1_7b_2k_lora method=dapo "$@"
