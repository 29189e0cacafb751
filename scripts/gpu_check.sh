#!/usr/bin/env bash
# The GPU checks in one command (docs/gpu.md#gpu-check): the loss path on CUDA in fp32 and bf16 against float64,
# the top-k KL's cost in bf16 against verl's log-prob path, and the memory probe of every table row in
# docs/gpu.md#checking-the-plan-on-one-gpu (each layer count in a fresh process). torch and transformers only: no
# verl, vLLM, Ray or flash-attn needed, so it runs on a bare GPU machine. One GPU, about 5 minutes on an H200.
#
#   bash scripts/gpu_check.sh [LOG_DIR]        # logs: LOG_DIR/{loss_check,topk_kl,probe_*}.log (default gpu_check/)
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-gpu_check}
py=${PYTHON:-python3}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
failed=()
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to LOG_DIR/NAME.log, remember a failure
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" 2>&1 | tee "$logs/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "== $name: exit $rc"; failed+=("$name"); }
}
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name())" \
    | tee "$logs/device.log"
step loss_check 90 "$py" benchmarks/gpu_loss_check.py
step topk_kl 120 "$py" benchmarks/bench_topk_kl.py --device cuda --dtype bf16 --tokens 2048,8192 --no-toy
probe() { step "probe_$1" 120 "$py" benchmarks/gpu_memory_probe.py --model "$2" --layers 2 4 8 --tokens "$3"; }
probe 7b_4k Qwen/Qwen2.5-Math-7B 4096
probe 4b_16k Qwen/Qwen3-4B 16384
probe 7b_16k Qwen/Qwen2.5-Math-7B 16384
probe 4b_8k Qwen/Qwen3-4B 8192
if [ ${#failed[@]} -gt 0 ]; then
    echo "[gpu check] FAILED: ${failed[*]} (logs in $logs/)"
    exit 1
fi
echo "[gpu check] all passed (logs in $logs/)"
