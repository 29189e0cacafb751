# shellcheck shell=bash
# The one launcher of the RPG recipes. Sourced (never executed) by every experiment script:
#
#     source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
#     setup_qwen3_4b 4                  # or setup_authors_7b math|instruct   (model, context, validation sets)
#     preset_rpg_reinforce urkl 1e-4    # the method (a family preset), then anything that differs
#     rpg_run "$@"
#
# rpg_run runs `$PYTHON -m rpg.launch <common> <profile> <optimizer> <script> "$@"` (Hydra overrides of the package's
# rpg/config/rpg_trainer.yaml, i.e. verl's own ppo_trainer plus the settings every recipe shares; later overrides win),
# or submits the same command with `ray job submit` when RAY_ADDRESS is set. This file sets only what its knobs change.
#
# Environment knobs (all optional):
#   MODEL_PATH TRAIN_FILE TEST_FILE CKPTS_DIR DATA_DIR NNODES N_GPUS PROJECT_NAME EXP_NAME PYTHON
#   Paths are taken literally (spaces and any other character included). TRAIN_FILE and TEST_FILE hold one path, or
#   several one per line (TEST_FILE="$(ls /data/val/*.parquet)"), or a Hydra list as verl's own scripts write it
#   (TEST_FILE="['/data/a b.parquet','/data/c.parquet']"); a value starting with `[` is read as such a list.
#   RAY_ADDRESS   submit to this Ray cluster (`ray job submit --working-dir <repo>`); unset: run locally
#   RPG_JOB_ENV   with RAY_ADDRESS: names of more environment variables to pass to the job, space-separated
#                 (e.g. RPG_JOB_ENV="HF_HOME WANDB_API_KEY"); RPG_RAY_FOLLOW=0 returns right after the submission
#   RPG_DRY_RUN=1 compose + validate the full config, print it as YAML and exit (no Ray, a few seconds)
#   RPG_PROFILE   gpu (default: the paper's setup) | cpu (sources recipe/rpg/cpu/profile.sh: tiny CPU run)
#   OPTIM         adamw (default) | schedulefree (sources recipe/rpg/optim/schedulefree.sh)
#   THINKING      false (default) | true: Qwen3's thinking mode, Qwen3-4B scripts only (setup_qwen3_4b)
#   RPG_PRINT_ARGV=1  print the final command and environment as JSON and exit (no Python; used by the tests)
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
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -z "${RAY_ADDRESS:-}" && -x "$RPG_REPO_DIR/.venv/bin/python" ]]; then PYTHON="$RPG_REPO_DIR/.venv/bin/python"
  else PYTHON=python3; fi
fi

# ---------------------------------------------------------------------------------------------------------------
# What an experiment script may set (defaults = the paper's RPG setup). Presets below set several at once.
# ---------------------------------------------------------------------------------------------------------------
CTX=2                   # context in K tokens: max prompt = max response = CTX*1024 (paper App. H: 2K ⇒ 4,096 total)
PROMPT_LEN=""           # override max_prompt_length (default CTX*1024)
RESPONSE_LEN=""         # override max_response_length (default CTX*1024)
TOKEN_LEN_FACTOR=1      # dynamic-batch token budget per GPU = factor × (prompt + response); the authors' *_rf_clip_ppo* used 4 (their *_rf.sh: 1)
LR=1e-6
ADV_ESTIMATOR=rpg
LOSS_MODE=vanilla
# RPG losses only; empty: not passed, so rpg.config.RPGPolicyLossConfig's default applies
KL_COEF=""              # β (policy_loss.kl_coef); the RPG presets set it from their second argument
REFERENCE=""            # KL reference: iterative (the default) | frozen | periodic (rpg.config.REFERENCE_MODES); frozen
                        # and periodic need USE_KL_LOSS=True KL_LOSS_COEF=0.0 (verl builds the reference model)
# REF_REFRESH_STEPS      periodic reference: K optimizer steps between refreshes (env or script)
# REF_REFRESH_KL         periodic reference: refresh when the token-KL moving average exceeds κ (env or script)
CLIP_LOW=0.2
CLIP_HIGH=0.28
USE_KL_LOSS=False       # verl's own KL loss against a frozen reference model (GRPO, REINFORCE++)
KL_LOSS_TYPE=low_var_kl
KL_LOSS_COEF=0.0
DYNAMIC_SAMPLING=True   # DAPO group filtering on acc
OVERLONG=True           # DAPO overlong penalty, buffer = response_length / 4 (512 at 2K, as the authors)
VAL_SETS="aime-2024 aime-2025 amc-2023"
ENABLE_THINKING=""      # Qwen3 chat template: data.apply_chat_template_kwargs.enable_thinking (setup_qwen3_4b sets it
                        # from THINKING); empty: not passed, the model's template renders with its defaults
RPG_SCRIPT_OVERRIDES=() # extra Hydra overrides of the script, placed after everything above

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
# or Qwen2.5-7B-Instruct (Table 8), 2K context, validation on AMC23, AIME24, AIME25.
setup_authors_7b() {
  case "${1:-}" in
    math) MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-Math-7B} ;;
    instruct) MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B-Instruct} ;;
    *) rpg_die "setup_authors_7b: model '${1:-}' is not valid; choose one of: math instruct" ;;
  esac
  CTX=2
  VAL_SETS="amc-2023 aime-2024 aime-2025"
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
_rpg_json_str() {  # JSON string literal of $1
  local s=${1//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/\\t}; s=${s//$'\r'/\\r}
  printf '"%s"' "$s"
}
_rpg_json_list() {  # JSON list of the arguments
  local sep="" a
  printf '['
  for a in "$@"; do printf '%s' "$sep"; _rpg_json_str "$a"; sep=", "; done
  printf ']'
}
_rpg_hydra_str() {  # $1 as a single-quoted Hydra value that composes to exactly $1 (a string, never interpolated)
  # Two escapes, per Hydra 1.3's quoted-value grammar and OmegaConf 2.3's interpolation grammar: k backslashes before
  # a quote or the closing quote become 2k (plus \ for the quote itself); k backslashes before `${` become 2k+1.
  local s=$1 out="" bs="" c i
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    if [[ "$c" == '\' ]]; then bs+='\'; continue; fi
    if [[ "$c" == "'" ]]; then out+="$bs$bs\\'"
    elif [[ "$c" == '$' && "${s:i+1:1}" == '{' ]]; then out+="$bs$bs\\\$"
    else out+="$bs$c"; fi
    bs=""
  done
  printf "'%s'" "$out$bs$bs"
}
_rpg_hydra_files() {  # Hydra list of the paths in $1, one per line (a path may hold spaces); $1 as is if it is a list
  if [[ "$1" == \[* ]]; then printf '%s' "$1"; return; fi
  local out="" f
  while IFS= read -r f; do
    if [[ -n "$f" ]]; then out+="${out:+,}$(_rpg_hydra_str "$f")"; fi
  done <<< "$1"
  printf '[%s]' "$out"
}

rpg_run() {
  local prompt_len=${PROMPT_LEN:-$((CTX * 1024))} response_len=${RESPONSE_LEN:-$((CTX * 1024))}
  local token_len=$((TOKEN_LEN_FACTOR * (prompt_len + response_len)))
  local exp_name=${EXP_NAME:-$RPG_SCRIPT_NAME}
  local ckpts_dir=${CKPTS_DIR:-$RPG_REPO_DIR/ckpts/$PROJECT_NAME/$exp_name}
  local model_path=${MODEL_PATH:-Qwen/Qwen3-4B}
  local test_files="${TEST_FILE:-}" v
  if [[ -z "$test_files" ]]; then  # one path per line (paths may hold spaces)
    for v in $VAL_SETS; do test_files+="${test_files:+$'\n'}$DATA_DIR/$v.parquet"; done
  fi
  local optim=${OPTIM:-adamw}
  if [[ -n "${THINKING:-}" && -z "$ENABLE_THINKING" ]]; then
    rpg_die "THINKING='$THINKING' is a knob of the Qwen3-4B scripts only (setup_qwen3_4b); unset it for this \
script (for another model with a thinking mode: the override +data.apply_chat_template_kwargs.enable_thinking=true)"
  fi

  # Everything fixed is in rpg/config/rpg_trainer.yaml; these are the knobs and what is computed from them.
  local -a common=(
    # data (docs/differences.md#s7-2, #s7-5): files, context length
    "data.train_files=$(_rpg_hydra_files "$TRAIN_FILE")"
    "data.val_files=$(_rpg_hydra_files "$test_files")"
    "data.max_prompt_length=$prompt_len"
    "data.max_response_length=$response_len"
    # method: advantage estimator, dynamic sampling, loss, clip, verl's KL loss, lr
    "algorithm.adv_estimator=$ADV_ESTIMATOR"
    "algorithm.filter_groups.enable=$DYNAMIC_SAMPLING"
    "actor_rollout_ref.actor.policy_loss.loss_mode=$LOSS_MODE"
    "actor_rollout_ref.actor.clip_ratio_low=$CLIP_LOW"
    "actor_rollout_ref.actor.clip_ratio_high=$CLIP_HIGH"
    "actor_rollout_ref.actor.use_kl_loss=$USE_KL_LOSS"
    "actor_rollout_ref.actor.kl_loss_type=$KL_LOSS_TYPE"
    "actor_rollout_ref.actor.kl_loss_coef=$KL_LOSS_COEF"
    "actor_rollout_ref.actor.optim.lr=$LR"
    # token budgets of the dynamic batch size and of vLLM's batches, from the context length (docs/differences.md#d14)
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$token_len"
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$token_len"
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=$token_len"
    "actor_rollout_ref.model.path=$(_rpg_hydra_str "$model_path")"
    "actor_rollout_ref.rollout.max_num_batched_tokens=$((prompt_len + response_len))"
    # DAPO overlong penalty (docs/differences.md#s7-4): on/off, buffer = the last quarter of the response
    "reward.reward_kwargs.overlong_buffer_cfg.enable=$OVERLONG"
    "reward.reward_kwargs.overlong_buffer_cfg.len=$((response_len / 4))"
    # names and cluster
    "trainer.project_name=$(_rpg_hydra_str "$PROJECT_NAME")"
    "trainer.experiment_name=$(_rpg_hydra_str "$exp_name")"
    "trainer.nnodes=$NNODES"
    "trainer.n_gpus_per_node=$N_GPUS"
    "trainer.default_local_dir=$(_rpg_hydra_str "$ckpts_dir")"
  )
  # chat template of training and validation prompts (verl's dataset and agent loop both read this key)
  [[ -z "$ENABLE_THINKING" ]] || common+=("+data.apply_chat_template_kwargs.enable_thinking=$ENABLE_THINKING")
  if [[ "$LOSS_MODE" == rpg_* || "$LOSS_MODE" == grpo_wk3 ]]; then
    common+=(actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig)
    # RPGPolicyLossConfig fields (new to verl's yaml: `+`), only when set: the defaults live in rpg/config.py
    [[ -z "$KL_COEF" ]] || common+=("+actor_rollout_ref.actor.policy_loss.kl_coef=$KL_COEF")
    [[ -z "$REFERENCE" ]] || common+=("+actor_rollout_ref.actor.policy_loss.reference=$REFERENCE")
    if [[ "$REFERENCE" == periodic ]]; then
      [[ -z "${REF_REFRESH_STEPS:-}" ]] ||
        common+=("+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=$REF_REFRESH_STEPS")
      [[ -z "${REF_REFRESH_KL:-}" ]] || common+=("+actor_rollout_ref.actor.policy_loss.ref_refresh_kl=$REF_REFRESH_KL")
    fi
  fi

  RPG_OPTIM_OVERRIDES=()
  case "$optim" in
    adamw) ;;
    schedulefree)
      local optim_dir=${RPG_OPTIM_DIR:-$RPG_RECIPE_DIR/optim}  # RPG_OPTIM_DIR: for tests only
      [[ -f "$optim_dir/schedulefree.sh" ]] || rpg_die "OPTIM=schedulefree: schedule-free support is not \
available yet ($optim_dir/schedulefree.sh is missing); refusing to run AdamW in its place"
      # shellcheck source=/dev/null
      source "$optim_dir/schedulefree.sh" ;;
    *) rpg_die "OPTIM='$optim' is not valid; choose one of: adamw schedulefree" ;;
  esac

  local -a cmd=("$PYTHON" -m rpg.launch "${common[@]}" "${RPG_PROFILE_OVERRIDES[@]}" "${RPG_OPTIM_OVERRIDES[@]}"
                "${RPG_SCRIPT_OVERRIDES[@]}" "$@")
  # Every process (driver, TaskRunner, workers) imports the plugin; a hard import fails loudly if it is broken.
  case ",${VERL_USE_EXTERNAL_MODULES:-}," in
    *,rpg.verl_plugin,*) ;;
    *) export VERL_USE_EXTERNAL_MODULES="${VERL_USE_EXTERNAL_MODULES:+$VERL_USE_EXTERNAL_MODULES,}rpg.verl_plugin" ;;
  esac

  local -a env_names=(VERL_USE_EXTERNAL_MODULES RPG_DRY_RUN WANDB_MODE)
  if [[ "${RPG_PRINT_ARGV:-0}" == 1 ]]; then
    local sep="" n
    printf '{"argv": %s, "ray_address": ' "$(_rpg_json_list "${cmd[@]}")"
    _rpg_json_str "${RAY_ADDRESS:-}"
    printf ', "env": {'
    for n in "${env_names[@]}"; do
      [[ -n "${!n+x}" ]] || continue
      printf '%s%s: %s' "$sep" "$(_rpg_json_str "$n")" "$(_rpg_json_str "${!n}")"; sep=", "
    done
    printf '}}\n'
    return 0
  fi

  if [[ -z "${RAY_ADDRESS:-}" ]]; then
    PYTHONPATH="$RPG_REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "${cmd[@]}"
    return
  fi
  # ---- Ray cluster (RAY_ADDRESS): the same command as a Ray job ------------------------------------------------------
  # Uploads the repo (without virtualenvs, data and outputs) as the working directory and the `rpg` package to every
  # node; forwards env_names, the profile's RPG_PROFILE_JOB_ENV (the CPU profile's platform settings) and the user's
  # RPG_JOB_ENV (space-separated names; those unset here are skipped). Prints the
  # submission id and the commands to follow, query and stop the job, then, by default, follows it: the logs stream
  # here and the exit code is the job's (`ray job submit` exits 1 if the job FAILED; Ctrl-C stops following, not the
  # job). RPG_RAY_FOLLOW=0 returns right after the submission. RPG_RAY_JOB_ID sets the submission id (default
  # rpg-<experiment>-<UTC time>-<random>; Ray refuses an id that the cluster already has).
  local follow=${RPG_RAY_FOLLOW:-1}
  [[ "$follow" == 0 || "$follow" == 1 ]] || rpg_die "RPG_RAY_FOLLOW='$follow' is not valid; choose one of: 0 1"
  command -v ray > /dev/null || rpg_die "RAY_ADDRESS='$RAY_ADDRESS' submits with Ray's CLI, but \`ray\` is not on \
PATH; activate the environment where rpg-verl is installed (e.g. source .venv/bin/activate), or unset RAY_ADDRESS to \
run locally"
  local job_id=${RPG_RAY_JOB_ID:-rpg-${exp_name//[^A-Za-z0-9_.-]/_}-$(date -u +%Y%m%d-%H%M%S)-$RANDOM}
  local env_json="" n
  local -a user_env=()
  read -ra user_env <<< "${RPG_JOB_ENV:-}"
  for n in "${user_env[@]}"; do
    [[ "$n" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || rpg_die "RPG_JOB_ENV='$RPG_JOB_ENV': '$n' is not an environment \
variable name; give names separated by spaces (e.g. RPG_JOB_ENV=\"HF_HOME WANDB_API_KEY\")"
  done
  for n in "${env_names[@]}" "${RPG_PROFILE_JOB_ENV[@]}" "${user_env[@]}"; do
    if [[ -n "${!n+x}" ]]; then
      env_json+="${env_json:+, }$(_rpg_json_str "$n"): $(_rpg_json_str "${!n}")"
    fi
  done
  local runtime_env
  runtime_env="{\"env_vars\": {$env_json}, \"py_modules\": [$(_rpg_json_str "$RPG_REPO_DIR/rpg")], \"excludes\": \
[\".venv*\", \".git\", \"data\", \"ckpts\", \"outputs\", \"wandb\", \"artifacts\", \"*.parquet\"]}"
  local -a wait_opt=()
  [[ "$follow" == 1 ]] || wait_opt=(--no-wait)
  echo "[rpg] Ray job submission id: $job_id (cluster $RAY_ADDRESS)" >&2
  echo "[rpg]   follow: ray job logs --address $RAY_ADDRESS --follow $job_id" >&2
  echo "[rpg]   status: ray job status --address $RAY_ADDRESS $job_id" >&2
  echo "[rpg]   stop:   ray job stop --address $RAY_ADDRESS $job_id" >&2
  ray job submit --address "$RAY_ADDRESS" --submission-id "$job_id" ${wait_opt[@]+"${wait_opt[@]}"} \
    --working-dir "$RPG_REPO_DIR" --runtime-env-json "$runtime_env" -- "${cmd[@]}"
}
