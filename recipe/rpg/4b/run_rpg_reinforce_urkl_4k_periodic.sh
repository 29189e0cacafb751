#!/usr/bin/env bash
# RPG-REINFORCE-URKL with the paper's periodic reference — Qwen3-4B, 4K context. Paper §5 "Iterative reference
# updates": π_ref ← π_θ every K optimizer steps or when a moving average of the token KL exceeds κ (no values given;
# the authors' code only refreshes every training step). K = 64 here = every 4 training steps (16 updates each);
# set REF_REFRESH_STEPS / REF_REFRESH_KL in the environment. Not a paper table row: the scheme the paper describes.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
setup_qwen3_4b 4
preset_rpg_reinforce urkl 1e-4
REFERENCE=periodic; USE_KL_LOSS=True; KL_LOSS_COEF=0.0
REF_REFRESH_STEPS=${REF_REFRESH_STEPS:-64}
rpg_run "$@"
