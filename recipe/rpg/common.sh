# shellcheck shell=bash
# The one launcher of the RPG recipes. Sourced (never executed) by every experiment script:
#
#     source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
#     setup_qwen3_4b 4                  # or setup_authors_7b math|instruct   (model, context, validation sets)
#     preset_rpg_reinforce urkl 1e-4    # the method (a family preset), then anything that differs
#     rpg_run "$@"
#
# rpg_run runs `$PYTHON -m rpg.launch <common> <profile> <optimizer> <script> "$@"` (Hydra overrides of verl's own
# ppo_trainer config; later overrides win), or submits the same command with `ray job submit` when RAY_ADDRESS is set.
#
# Environment knobs (all optional):
#   MODEL_PATH TRAIN_FILE TEST_FILE CKPTS_DIR DATA_DIR NNODES N_GPUS PROJECT_NAME EXP_NAME PYTHON
#   RAY_ADDRESS   submit to this Ray cluster (`ray job submit --working-dir <repo>`); unset: run locally
#   RPG_DRY_RUN=1 compose + validate the full config, print it as YAML and exit (no Ray, a few seconds)
#   RPG_PROFILE   gpu (default: the paper's setup) | cpu (sources recipe/rpg/cpu/profile.sh: tiny CPU run)
#   OPTIM         adamw (default) | schedulefree (sources recipe/rpg/optim/schedulefree.sh)
#   RPG_PRINT_ARGV=1  print the final command and environment as JSON and exit (no Python; used by the tests)
#   WANDB_MODE=offline  log to ./wandb without a network (then `wandb sync`); the logger is console + wandb
#
# Paper hyper-parameters (SPEC §7.5, §9.2): 512 prompts/step × 16 responses, mini-batch 32 prompts (16 optimizer
# steps per step), token-mean loss, dual-clip c = 10, AdamW lr 1e-6 (wd 0.1, grad clip 1.0, 10 warm-up steps then
# constant), temperature 1.0, 400 steps, validation mean@32 (n=1 sampled on 32×-duplicated files) every 10 steps,
# DAPO reward manager (overlong buffer) + the reference's scorer (rpg.data.reward), DAPO dynamic sampling.
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
  gpu) RPG_PROFILE_OVERRIDES=() ;;
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
TOKEN_LEN_FACTOR=1      # dynamic-batch token budget per GPU = factor × (prompt + response); the authors' *_rf* used 4
LR=1e-6
ADV_ESTIMATOR=rpg
LOSS_MODE=vanilla
KL_COEF=1e-4            # β of the RPG losses (policy_loss.kl_coef); only passed for RPG losses
REFERENCE=iterative     # RPG KL reference: iterative | frozen | periodic (rpg.config.REFERENCE_MODES); frozen and
                        # periodic need USE_KL_LOSS=True KL_LOSS_COEF=0.0 (verl builds the reference model)
# REF_REFRESH_STEPS      periodic reference: K optimizer steps between refreshes (unset/0: off; env or script)
# REF_REFRESH_KL         periodic reference: refresh when the token-KL moving average exceeds κ (unset/0: off)
CLIP_LOW=0.2
CLIP_HIGH=0.28
CLIP_C=10.0
USE_KL_LOSS=False       # verl's own KL loss against a frozen reference model (GRPO, REINFORCE++)
KL_LOSS_TYPE=low_var_kl
KL_LOSS_COEF=0.0
DYNAMIC_SAMPLING=True   # DAPO group filtering on acc
OVERLONG=True           # DAPO overlong penalty, buffer = response_length / 4 (512 at 2K, as the authors)
VAL_SETS="aime-2024 aime-2025 amc-2023"
RPG_SCRIPT_OVERRIDES=() # extra Hydra overrides of the script, placed after everything above

RPG_DIVERGENCES="fkl rkl ufkl urkl"
_rpg_check_div() {
  [[ " $RPG_DIVERGENCES " == *" ${1:-} "* ]] || rpg_die "divergence '${1:-}' is not valid; choose one of: $RPG_DIVERGENCES"
}

# ---------------------------------------------------------------------------------------------------------------
# Setups (model, context, validation sets)
# ---------------------------------------------------------------------------------------------------------------
# setup_qwen3_4b CTX: the paper's main experiments (Qwen3-4B; Tables 3, 5, 6, 7). The paper does not say whether
# the base or the post-trained checkpoint was used (SPEC §7.1); set MODEL_PATH to choose.
setup_qwen3_4b() {
  case "${1:-}" in 2|4|8) CTX=$1 ;; *) rpg_die "setup_qwen3_4b: context '${1:-}' is not valid; choose one of: 2 4 8" ;; esac
  MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-4B}
  VAL_SETS="aime-2024 aime-2025 amc-2023"
  if [[ "$CTX" == 4 ]]; then VAL_SETS+=" minerva-math olympiadbench"; fi  # Table 7 is reported at 4K only
}

# setup_authors_7b math|instruct: the authors' published scripts (SPEC §9): Qwen2.5-Math-7B or Qwen2.5-7B-Instruct
# (Table 8), 2K context, validation on AMC23, AIME24, AIME25.
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
# Family presets (SPEC §9.3 family summary; paper §5)
# ---------------------------------------------------------------------------------------------------------------
# DAPO: GRPO advantages, clip-higher (0.2, 0.28), dynamic sampling, overlong penalty, no KL.
preset_dapo() { ADV_ESTIMATOR=grpo; LOSS_MODE=vanilla; CLIP_LOW=0.2; CLIP_HIGH=0.28; USE_KL_LOSS=False; }

# GRPO: GRPO advantages + k3 (low_var_kl) KL loss, β = 1e-3, against the frozen initial model; clip (0.2, 0.2)
# (paper §5 and the scripts; App. H says (0.1, 0.1), SPEC D13); no overlong penalty, no dynamic sampling.
preset_grpo() {
  ADV_ESTIMATOR=grpo; LOSS_MODE=vanilla; CLIP_LOW=0.2; CLIP_HIGH=0.2
  USE_KL_LOSS=True; KL_LOSS_TYPE=low_var_kl; KL_LOSS_COEF=1e-3
  DYNAMIC_SAMPLING=False; OVERLONG=False
}

# REINFORCE++ (-Baseline): verl's estimators + a k1 ("kl") KL loss, β = 1e-4. The authors' k1 was taken against
# π_old (iterative reference, SPEC D21); verl 0.9.1's KL loss always uses its frozen reference model, so here the
# k1 term is against the initial model. At β = 1e-4 either term is tiny; this is the one deviation of the baselines.
preset_reinforce_pp() {
  ADV_ESTIMATOR=reinforce_plus_plus; LOSS_MODE=vanilla; CLIP_LOW=0.2; CLIP_HIGH=0.28
  USE_KL_LOSS=True; KL_LOSS_TYPE=kl; KL_LOSS_COEF=1e-4
}
preset_reinforce_pp_baseline() { preset_reinforce_pp; ADV_ESTIMATOR=reinforce_plus_plus_baseline; }

# RPG-<DIV> (fully differentiable, Algorithm 1 with the authors' additive KL; SPEC §4.2): preset_rpg DIV [β]
preset_rpg() { _rpg_check_div "${1:-}"; ADV_ESTIMATOR=rpg; LOSS_MODE="rpg_$1"; KL_COEF=${2:-1e-4}; }

# RPG-REINFORCE-<DIV> with RPG-Style Clip (Algorithm 2; SPEC §4.3): preset_rpg_reinforce DIV [β]
preset_rpg_reinforce() { _rpg_check_div "${1:-}"; ADV_ESTIMATOR=rpg; LOSS_MODE="rpg_reinforce_$1"; KL_COEF=${2:-1e-4}; }

# The authors' non-dual-clip REINFORCE (`rpg_rf_<div>`: truncated importance weight, SPEC D6): DIV [β]
preset_rpg_reinforce_hardclip() {
  _rpg_check_div "${1:-}"; ADV_ESTIMATOR=rpg; LOSS_MODE="rpg_reinforce_hardclip_$1"; KL_COEF=${2:-1e-4}
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
_rpg_hydra_files() {  # a Hydra list of quoted paths, or $1 unchanged if it already is a list
  if [[ "$1" == \[* ]]; then printf '%s' "$1"; return; fi
  local out="" f
  for f in $1; do out+="${out:+,}'$f'"; done
  printf '[%s]' "$out"
}

rpg_run() {
  local prompt_len=${PROMPT_LEN:-$((CTX * 1024))} response_len=${RESPONSE_LEN:-$((CTX * 1024))}
  local token_len=$((TOKEN_LEN_FACTOR * (prompt_len + response_len)))
  local exp_name=${EXP_NAME:-$RPG_SCRIPT_NAME}
  local ckpts_dir=${CKPTS_DIR:-$RPG_REPO_DIR/ckpts/$PROJECT_NAME/$exp_name}
  local model_path=${MODEL_PATH:-Qwen/Qwen3-4B}
  local test_files="${TEST_FILE:-}" v
  if [[ -z "$test_files" ]]; then for v in $VAL_SETS; do test_files+=" $DATA_DIR/$v.parquet"; done; fi
  local optim=${OPTIM:-adamw}

  local -a common=(
    # data (SPEC §7.2, §7.5)
    "data.train_files=$(_rpg_hydra_files "$TRAIN_FILE")"
    "data.val_files=$(_rpg_hydra_files "$test_files")"
    data.prompt_key=prompt
    data.truncation=left
    "data.max_prompt_length=$prompt_len"
    "data.max_response_length=$response_len"
    data.train_batch_size=512
    # algorithm
    "algorithm.adv_estimator=$ADV_ESTIMATOR"
    algorithm.use_kl_in_reward=False
    "algorithm.filter_groups.enable=$DYNAMIC_SAMPLING"
    algorithm.filter_groups.metric=acc
    # The authors generated 3 × 512 prompts per round (max 20 rounds). verl 0.9.1's v1 replay buffer refills
    # evicted groups until 512 prompts are kept, with at most max_inflight_gen_batches × 512 prompts in flight
    # (it ignores max_num_gen_batches, so that key is not set).
    algorithm.filter_groups.max_inflight_gen_batches=3
    # actor: loss, clip, optimizer
    "actor_rollout_ref.actor.policy_loss.loss_mode=$LOSS_MODE"
    "actor_rollout_ref.actor.clip_ratio_low=$CLIP_LOW"
    "actor_rollout_ref.actor.clip_ratio_high=$CLIP_HIGH"
    "actor_rollout_ref.actor.clip_ratio_c=$CLIP_C"
    actor_rollout_ref.actor.loss_agg_mode=token-mean
    actor_rollout_ref.actor.entropy_coeff=0
    "actor_rollout_ref.actor.use_kl_loss=$USE_KL_LOSS"
    "actor_rollout_ref.actor.kl_loss_type=$KL_LOSS_TYPE"
    "actor_rollout_ref.actor.kl_loss_coef=$KL_LOSS_COEF"
    actor_rollout_ref.actor.ppo_mini_batch_size=32
    actor_rollout_ref.actor.ppo_epochs=1
    "actor_rollout_ref.actor.optim.lr=$LR"
    actor_rollout_ref.actor.optim.lr_warmup_steps=10
    actor_rollout_ref.actor.optim.lr_scheduler_type=constant
    actor_rollout_ref.actor.optim.weight_decay=0.1
    actor_rollout_ref.actor.optim.clip_grad=1.0
    # dynamic batch size, packed sequences, gradient checkpointing (SPEC §7.1, §7.5)
    actor_rollout_ref.actor.use_dynamic_bsz=True
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$token_len"
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$token_len"
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=$token_len"
    "actor_rollout_ref.model.path=$model_path"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    +actor_rollout_ref.model.override_config.attention_dropout=0.0
    +actor_rollout_ref.model.override_config.embd_pdrop=0.0
    +actor_rollout_ref.model.override_config.resid_pdrop=0.0
    # rollout (vLLM) and validation: mean@32 = n=1 sampled at T=1 on 32×-duplicated files (SPEC §7.6)
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=16
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.top_p=1.0
    actor_rollout_ref.rollout.top_k=-1
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85
    actor_rollout_ref.rollout.enable_chunked_prefill=True
    "actor_rollout_ref.rollout.max_num_batched_tokens=$((prompt_len + response_len))"
    actor_rollout_ref.rollout.val_kwargs.n=1
    actor_rollout_ref.rollout.val_kwargs.do_sample=True
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0
    actor_rollout_ref.rollout.val_kwargs.top_p=1.0
    actor_rollout_ref.rollout.val_kwargs.top_k=-1
    # reward: DAPO manager (overlong penalty, SPEC §7.4 step 3) + the reference's scorer (steps 1-2)
    reward.reward_manager.name=dapo
    reward.custom_reward_function.path=pkg://rpg.data.reward
    reward.custom_reward_function.name=compute_score
    "+reward.reward_kwargs.max_resp_len=$response_len"
    "+reward.reward_kwargs.overlong_buffer_cfg.enable=$OVERLONG"
    "+reward.reward_kwargs.overlong_buffer_cfg.len=$((response_len / 4))"
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
    +reward.reward_kwargs.overlong_buffer_cfg.log=False
    # trainer: 400 steps (total_epochs only needs to be large enough), eval every 10, save every 20
    "trainer.project_name=$PROJECT_NAME"
    "trainer.experiment_name=$exp_name"
    "trainer.logger=[console,wandb]"
    "trainer.nnodes=$NNODES"
    "trainer.n_gpus_per_node=$N_GPUS"
    trainer.total_training_steps=400
    trainer.total_epochs=1000
    trainer.val_before_train=True
    trainer.test_freq=10
    trainer.save_freq=20
    trainer.max_actor_ckpt_to_keep=1
    trainer.resume_mode=auto
    "trainer.default_local_dir=$ckpts_dir"
  )
  if [[ "$LOSS_MODE" == rpg_* || "$LOSS_MODE" == grpo_wk3 ]]; then
    common+=(
      actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig
      "+actor_rollout_ref.actor.policy_loss.kl_coef=$KL_COEF"
      "+actor_rollout_ref.actor.policy_loss.reference=$REFERENCE"
    )
    if [[ "$REFERENCE" == periodic ]]; then
      common+=(
        "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=${REF_REFRESH_STEPS:-0}"
        "+actor_rollout_ref.actor.policy_loss.ref_refresh_kl=${REF_REFRESH_KL:-0.0}"
      )
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
  # node; forwards env_names plus the profile's RPG_JOB_ENV (the CPU profile's platform settings). Prints the
  # submission id and the commands to follow, query and stop the job, then, by default, follows it: the logs stream
  # here and the exit code is the job's (`ray job submit` exits 1 if the job FAILED; Ctrl-C stops following, not the
  # job). RPG_RAY_FOLLOW=0 returns right after the submission. RPG_RAY_JOB_ID sets the submission id (default
  # rpg-<experiment>-<UTC time>-<random>; Ray refuses an id that the cluster already has).
  local follow=${RPG_RAY_FOLLOW:-1}
  [[ "$follow" == 0 || "$follow" == 1 ]] || rpg_die "RPG_RAY_FOLLOW='$follow' is not valid; choose one of: 0 1"
  local job_id=${RPG_RAY_JOB_ID:-rpg-${exp_name//[^A-Za-z0-9_.-]/_}-$(date -u +%Y%m%d-%H%M%S)-$RANDOM}
  local env_json="" n
  for n in "${env_names[@]}" ${RPG_JOB_ENV[@]+"${RPG_JOB_ENV[@]}"}; do
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
