#!/usr/bin/env bash
# RPG-REINFORCE-UFKL with clip (0.1, 0.1) — Qwen3-4B, 2K context. Paper: Fig. 8 (clip ablation;
# compare run_rpg_reinforce_ufkl_2k.sh with (0.2, 0.28)).
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 2
preset_rpg_reinforce ufkl 1e-4
clip 0.1 0.1
rpg_run "$@"
