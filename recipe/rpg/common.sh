# shellcheck shell=bash
# The one launcher of the RPG recipes. Sourced (never executed) by every experiment script:
#
#     source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
#     setup_qwen3_4b 4                  # or setup_authors_7b math|instruct   (model, context, validation sets)
#     preset_rpg_reinforce urkl 1e-4    # the method (a family preset), then anything that differs
#     rpg_run "$@"
#
# rpg_run hands the knob values to rpg/preflight/recipe_argv.py, which runs `$PYTHON -m rpg.launch <knobs' overrides>
# <profile> <optimizer> <script> "$@"` (Hydra overrides of the package's rpg/config/rpg_trainer.yaml, i.e. verl's own
# ppo_trainer plus the settings every recipe shares; later overrides win), or submits the same command to the Ray
# cluster at RAY_ADDRESS (Ray's job-submission SDK). This file holds the knobs and the presets; Python the logic.
#
# Environment knobs (all optional):
#   MODEL_PATH TRAIN_FILE TEST_FILE CKPTS_DIR DATA_DIR NNODES N_GPUS PROJECT_NAME EXP_NAME
#   OLD_LOGPROB   recompute (default) | rollout: π_old from the rollout's log-probs (bypass, docs/async.md#knobs)
#   TRAINER_MODE  sync (default) | colocate_async | separate_async: verl's v1 trainer mode (docs/async.md#knobs)
#   PYTHON        the interpreter (GPU: python3 from your environment; CPU profile: the repository's .venv if present)
#   Paths are taken literally (spaces and any other character included). TRAIN_FILE and TEST_FILE hold one path, or
#   several one per line (TEST_FILE="$(ls /data/val/*.parquet)"), or a Hydra list as verl's own scripts write it
#   (TEST_FILE="['/data/a b.parquet','/data/c.parquet']"); a value starting with `[` is read as such a list.
#   RAY_ADDRESS   submit to this Ray cluster (working directory: the repo); unset: run locally
#   RPG_JOB_ENV   with RAY_ADDRESS: names of more environment variables to pass to the job, space-separated
#                 (e.g. RPG_JOB_ENV="HF_HOME WANDB_API_KEY"); RPG_RAY_FOLLOW=0 returns right after the submission
#   RPG_DRY_RUN=1 compose + validate the full config, print it as YAML and exit (no Ray, a few seconds)
#   SMOKE=1       smoke run: the recipe for 2 steps on the smallest full batch, then per-phase seconds, peak memory and
#                 the projected wall time, through a checkpoint at step 1 and its resume (docs/gpu.md#smoke);
#                 RPG_SMOKE_DIR: its folder (outputs/smoke); SMOKE_ROLLOUT=full: the recipe's whole rollout batch
#   GPU_MEMORY_GIB  the per-GPU budget of the memory plan every GPU run prints (default: the GPU's, else 80)
#   RPG_PROFILE   gpu (default: the paper's setup) | cpu (sources recipe/rpg/cpu/profile.sh: tiny CPU run)
#   OPTIM         adamw (default) | schedulefree (sources recipe/rpg/optim/schedulefree.sh)
#   THINKING      false (default) | true: Qwen3's thinking mode, Qwen3-4B scripts only (setup_qwen3_4b)
#   RPG_PRINT_ARGV=1  print the final command and environment as JSON and exit (no verl import; used by the tests)
#   WANDB_MODE=offline  log to ./wandb without a network (then `wandb sync`); the logger is console + wandb
#
# Paper hyper-parameters (paper App. H; docs/differences.md#s7-5): 512 prompts/step × 16 responses, mini-batch 32
# prompts (16 optimizer steps per step), token-mean loss, dual-clip c = 10, AdamW lr 1e-6 (wd 0.1, grad clip 1.0, 10
# warm-up steps then constant), temperature 1.0, 400 steps, validation mean@32 (n=1 sampled on 32×-duplicated files)
# every 10 steps, DAPO reward manager (overlong buffer) + the reference's scorer (rpg.data.reward), DAPO dynamic
# sampling. The fixed ones are in rpg/config/rpg_trainer.yaml; the lr, the context and the method are set below.
set -euo pipefail

RPG_RECIPE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RPG_REPO_DIR="$(cd "$RPG_RECIPE_DIR/../.." && pwd)"
RPG_SCRIPT_NAME="$(basename "${BASH_SOURCE[1]:-rpg_run}" .sh)"

rpg_die() { echo "[rpg] error: $*" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------------------------
# Environment knobs. The CPU profile (sourced first) may set its own defaults; a value from the environment wins.
# ---------------------------------------------------------------------------------------------------------------
: "${RPG_PROFILE:=gpu}"
case "$RPG_PROFILE" in
  gpu) RPG_PROFILE_OVERRIDES=(); RPG_PROFILE_JOB_ENV=() ;;
  cpu)
    [[ -f "$RPG_RECIPE_DIR/cpu/profile.sh" ]] || rpg_die "RPG_PROFILE=cpu needs $RPG_RECIPE_DIR/cpu/profile.sh (not found)"
    # shellcheck source=/dev/null
    source "$RPG_RECIPE_DIR/cpu/profile.sh" ;;
  *) rpg_die "RPG_PROFILE='$RPG_PROFILE' is not valid; choose one of: gpu cpu" ;;
esac
: "${NNODES:=1}"
: "${N_GPUS:=8}"
: "${PROJECT_NAME:=rpg-verl}"
: "${DATA_DIR:=$RPG_REPO_DIR/data}"
: "${TRAIN_FILE:=$DATA_DIR/dapo-math-17k-eng.parquet}"
# PYTHON: GPU runs use `python3` from the user's environment (the one with requirements-gpu.txt): the repository's .venv
# is the CPU environment (no vLLM, no flash-attn), used by default by local CPU-profile runs only.
if [[ -z "${PYTHON:-}" ]]; then
  if [[ "$RPG_PROFILE" == cpu && -z "${RAY_ADDRESS:-}" && -x "$RPG_REPO_DIR/.venv/bin/python" ]]; then
    PYTHON="$RPG_REPO_DIR/.venv/bin/python"
  else PYTHON=python3; fi
fi

# ---------------------------------------------------------------------------------------------------------------
# What an experiment script may set (CTX LR ADV_ESTIMATOR LOSS_MODE KL_COEF REFERENCE CLIP_LOW CLIP_HIGH USE_KL_LOSS
# KL_LOSS_TYPE KL_LOSS_COEF DYNAMIC_SAMPLING OVERLONG VAL_SETS PROMPT_LEN RESPONSE_LEN TOKEN_LEN_FACTOR ENABLE_THINKING
# GPU_MEMORY_UTILIZATION):
# one list, with defaults (the paper's RPG setup), Hydra keys and meanings, in rpg/preflight/recipe_argv.py (KNOBS;
# the table in recipe/rpg/README.md). Reset here to their defaults; presets below set several at once.
# ---------------------------------------------------------------------------------------------------------------
_rpg_defaults=$("$PYTHON" "$RPG_REPO_DIR/rpg/preflight/recipe_argv.py" --shell-defaults) ||
  rpg_die "PYTHON='$PYTHON' cannot run $RPG_REPO_DIR/rpg/preflight/recipe_argv.py; set PYTHON to a Python 3 interpreter"
eval "$_rpg_defaults"; unset _rpg_defaults
RPG_SCRIPT_OVERRIDES=() # extra Hydra overrides of the script, placed after everything the knobs set

RPG_DIVERGENCES="fkl rkl ufkl urkl"
_rpg_check_div() {
  [[ " $RPG_DIVERGENCES " == *" ${1:-} "* ]] || rpg_die "divergence '${1:-}' is not valid; choose one of: $RPG_DIVERGENCES"
}

# ---------------------------------------------------------------------------------------------------------------
# Setups (model, context, validation sets)
# ---------------------------------------------------------------------------------------------------------------
# setup_qwen3_4b CTX: the paper's main experiments (Qwen3-4B; Tables 3, 5, 6, 7). The paper does not say whether
# the base or the post-trained checkpoint was used (docs/differences.md#s7-1); set MODEL_PATH to choose.
# THINKING=false|true (default false): Qwen3's chat template thinks unless enable_thinking=False; the paper does not
# say which mode it used. Off by default: its mean response lengths stay far below the limit at every context
# (about 1.1K of 2K, Fig. 6) and it compares with the non-thinking Qwen3-4B-Instruct (§5); docs/differences.md#d26.
setup_qwen3_4b() {
  case "${1:-}" in 2|4|8) CTX=$1 ;; *) rpg_die "setup_qwen3_4b: context '${1:-}' is not valid; choose one of: 2 4 8" ;; esac
  MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-4B}
  ENABLE_THINKING=${THINKING:-false}  # checked by rpg.launch (true or false)
  VAL_SETS="aime-2024 aime-2025 amc-2023"
  if [[ "$CTX" == 4 ]]; then VAL_SETS+=" minerva-math olympiadbench"; fi  # Table 7 is reported at 4K only
}

# setup_authors_7b math|instruct: the authors' published scripts (docs/differences.md#authors-scripts): Qwen2.5-Math-7B
# or Qwen2.5-7B-Instruct (Table 8), 2K context, validation on AMC23, AIME24, AIME25. vLLM takes 0.8 of each GPU, not
# the authors' 0.85, so that the rollout fits 80 GB GPUs next to the actor (memory only: docs/differences.md#d28).
setup_authors_7b() {
  case "${1:-}" in
    math) MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-Math-7B} ;;
    instruct) MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B-Instruct} ;;
    *) rpg_die "setup_authors_7b: model '${1:-}' is not valid; choose one of: math instruct" ;;
  esac
  CTX=2
  VAL_SETS="amc-2023 aime-2024 aime-2025"
  GPU_MEMORY_UTILIZATION=0.8
}

# ---------------------------------------------------------------------------------------------------------------
# Family presets (docs/differences.md#authors-scripts family table; paper §5)
# ---------------------------------------------------------------------------------------------------------------
# DAPO: GRPO advantages, clip-higher (0.2, 0.28), dynamic sampling, overlong penalty, no KL.
preset_dapo() { ADV_ESTIMATOR=grpo; LOSS_MODE=vanilla; CLIP_LOW=0.2; CLIP_HIGH=0.28; USE_KL_LOSS=False; }

# GRPO: GRPO advantages + k3 (low_var_kl) KL loss, β = 1e-3, against the frozen initial model; clip (0.2, 0.2)
# (paper §5 and the scripts; App. H says (0.1, 0.1), docs/differences.md#d13); no overlong penalty, no dynamic sampling.
preset_grpo() {
  ADV_ESTIMATOR=grpo; LOSS_MODE=vanilla; CLIP_LOW=0.2; CLIP_HIGH=0.2
  USE_KL_LOSS=True; KL_LOSS_TYPE=low_var_kl; KL_LOSS_COEF=1e-3
  DYNAMIC_SAMPLING=False; OVERLONG=False
}

# REINFORCE++ (-Baseline): verl's estimators + a k1 ("kl") KL loss, β = 1e-4. The authors' k1 was taken against
# π_old (iterative reference); verl 0.9.1's KL loss always uses its frozen reference model, so here the k1 term is
# against the initial model. The gradient is the same (neither reference term depends on θ); only the logged KL and
# the cost of the reference model differ (docs/differences.md#d21).
preset_reinforce_pp() {
  ADV_ESTIMATOR=reinforce_plus_plus; LOSS_MODE=vanilla; CLIP_LOW=0.2; CLIP_HIGH=0.28
  USE_KL_LOSS=True; KL_LOSS_TYPE=kl; KL_LOSS_COEF=1e-4
}
preset_reinforce_pp_baseline() { preset_reinforce_pp; ADV_ESTIMATOR=reinforce_plus_plus_baseline; }

# RPG-<DIV> (fully differentiable, Algorithm 1 with the authors' additive KL, docs/losses.md#additive):
# preset_rpg DIV [β] (β omitted: RPGPolicyLossConfig's default)
preset_rpg() { _rpg_check_div "${1:-}"; ADV_ESTIMATOR=rpg; LOSS_MODE="rpg_$1"; KL_COEF=${2:-}; }

# RPG-REINFORCE-<DIV> with RPG-Style Clip (Algorithm 2; docs/losses.md#algorithm-2): preset_rpg_reinforce DIV [β]
preset_rpg_reinforce() { _rpg_check_div "${1:-}"; ADV_ESTIMATOR=rpg; LOSS_MODE="rpg_reinforce_$1"; KL_COEF=${2:-}; }

# The authors' non-dual-clip REINFORCE (`rpg_rf_<div>`: truncated importance weight, docs/differences.md#d6): DIV [β]
preset_rpg_reinforce_hardclip() {
  _rpg_check_div "${1:-}"; ADV_ESTIMATOR=rpg; LOSS_MODE="rpg_reinforce_hardclip_$1"; KL_COEF=${2:-}
}

# clip LOW HIGH: the ratio clip (ε1, ε2) of every family (verl's actor.clip_ratio_low/high).
clip() { [[ $# == 2 ]] || rpg_die "clip needs two values: clip LOW HIGH"; CLIP_LOW=$1; CLIP_HIGH=$2; }

# ---------------------------------------------------------------------------------------------------------------
# rpg_run [extra Hydra overrides...]
# ---------------------------------------------------------------------------------------------------------------
rpg_run() {
  RPG_OPTIM_OVERRIDES=()
  case "${OPTIM:-adamw}" in
    adamw) ;;
    schedulefree)
      local optim_dir=${RPG_OPTIM_DIR:-$RPG_RECIPE_DIR/optim}  # RPG_OPTIM_DIR: for tests only
      [[ -f "$optim_dir/schedulefree.sh" ]] || rpg_die "OPTIM=schedulefree needs $optim_dir/schedulefree.sh (not \
found); refusing to run AdamW in its place"
      # shellcheck source=/dev/null
      source "$optim_dir/schedulefree.sh" ;;
    *) rpg_die "OPTIM='$OPTIM' is not valid; choose one of: adamw schedulefree" ;;
  esac
  # Python builds the command from the knob values (rpg/preflight/recipe_argv.py), then prints it (RPG_PRINT_ARGV=1),
  # runs it here, or submits it to the Ray cluster at RAY_ADDRESS (rpg/preflight/ray_submit.py).
  local -a args=(--repo "$RPG_REPO_DIR" --script "$RPG_SCRIPT_NAME" --python "$PYTHON") o
  for o in "${RPG_KNOB_NAMES[@]}"; do [[ -z "${!o+x}" ]] || args+=(--knob "$o=${!o}"); done
  for o in ${RPG_PROFILE_OVERRIDES[@]+"${RPG_PROFILE_OVERRIDES[@]}"}; do args+=(--profile-override "$o"); done
  for o in ${RPG_OPTIM_OVERRIDES[@]+"${RPG_OPTIM_OVERRIDES[@]}"}; do args+=(--optim-override "$o"); done
  for o in ${RPG_SCRIPT_OVERRIDES[@]+"${RPG_SCRIPT_OVERRIDES[@]}"}; do args+=(--script-override "$o"); done
  for o in ${RPG_PROFILE_JOB_ENV[@]+"${RPG_PROFILE_JOB_ENV[@]}"}; do args+=(--job-env "$o"); done
  "$PYTHON" "$RPG_REPO_DIR/rpg/preflight/recipe_argv.py" "${args[@]}" -- "$@"
}
