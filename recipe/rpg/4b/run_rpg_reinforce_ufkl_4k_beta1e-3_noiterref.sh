#!/usr/bin/env bash
# RPG-REINFORCE-UFKL with β = 1e-3 and no iterative reference — Qwen3-4B, 4K context. Paper: Fig. 9 "noiterref".
# The KL reference is the frozen initial model: verl builds it (use_kl_loss=True) and adds no KL of its own
# (kl_loss_coef=0); the loss uses the ρ-weighted estimator of docs/losses.md#rho-weighting (the authors' code had none,
# docs/differences.md#d10).
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 4
preset_rpg_reinforce ufkl 1e-3
REFERENCE=frozen; USE_KL_LOSS=True; KL_LOSS_COEF=0.0
rpg_run "$@"
