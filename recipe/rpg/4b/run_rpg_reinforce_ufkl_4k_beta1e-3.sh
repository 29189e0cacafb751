#!/usr/bin/env bash
# RPG-REINFORCE-UFKL with β = 1e-3 — Qwen3-4B, 4K context. Paper: Fig. 9 (KL-coefficient ablation;
# compare run_rpg_reinforce_ufkl_4k.sh with β = 1e-4).
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 4
preset_rpg_reinforce ufkl 1e-3
rpg_run "$@"
