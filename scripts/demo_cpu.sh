#!/usr/bin/env bash
# The README's main job: RPG-REINFORCE-URKL trained with verl 0.9.1's real trainer on a 2-core CPU in ~10 minutes.
#
#   bash scripts/demo_cpu.sh [extra Hydra overrides...]
#
# 1. builds .venv if needed (scripts/setup_env.sh);
# 2. builds the offline tiny model and the column-addition task if missing (python -m rpg.tools.tiny_model, ~1.5 min);
# 3. runs recipe/rpg/cpu/run_rpg_reinforce_urkl.sh (the shared launcher with RPG_PROFILE=cpu), validating before
#    training and every CPU_TEST_FREQ steps on 200 held-out problems (4 samples each at T=1), printing one progress
#    line per step;
# 4. prints validation accuracy before/after and writes the curves (python -m rpg.tools.report) to artifacts/demo/;
# 5. evaluates the final checkpoint (saved to $DEMO_OUT/ckpt) with rpg-evaluate on the same 200 problems and prints its
#    mean@k next to the last in-training validation (fresh samples: they agree within the printed standard error).
#
# Knobs (environment): CPU_STEPS (default 50), CPU_TEST_FREQ (10), CPU_SEED (0), CPU_LR (1e-4), CPU_MINI_BATCH (8), DEMO_OUT
# (artifacts/demo), DEMO_VAL_N (4 samples per validation prompt), DEMO_EVAL_K (rpg-evaluate's k, default DEMO_VAL_N),
# CPU_ROLLOUT (hf; vllm: verl's vLLM rollout, builds .venv-vllm first), CPU_DTYPE (fp32) and the other knobs of
# rpg/config/profile/cpu.yaml (sizes: rpg/preflight/recipe_argv.py, cpu_profile).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash "$ROOT/scripts/setup_env.sh"
if [[ "${CPU_ROLLOUT:-hf}" == vllm ]]; then bash "$ROOT/scripts/setup_env.sh" --vllm; fi  # verl's vLLM rollout
PY="$ROOT/.venv/bin/python"

export CPU_STEPS=${CPU_STEPS:-50} CPU_TEST_FREQ=${CPU_TEST_FREQ:-10} CPU_SEED=${CPU_SEED:-0}
# Two optimizer updates per step (mini-batch = half the 16-prompt batch): the second update is off-policy, so the
# RPG KL to the iterative reference π_old is active (with one update per step π_θ = π_old and the KL term is 0).
export CPU_MINI_BATCH=${CPU_MINI_BATCH:-8}
export EXP_NAME=${EXP_NAME:-demo_rpg_reinforce_urkl}
OUT=${DEMO_OUT:-$ROOT/artifacts/demo}
mkdir -p "$OUT"
export VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" CKPTS_DIR="$OUT/ckpt"
rm -f "$VERL_FILE_LOGGER_PATH"

start=$(date +%s)
echo "[demo] building the tiny model and task if missing (artifacts/tiny) ..."
nice -n 10 "$PY" -m rpg.tools.tiny_model --out "$ROOT/artifacts/tiny"
echo "[demo] training RPG-REINFORCE-URKL for $CPU_STEPS steps with verl's trainer (full log: $OUT/console.log) ..."
set +e
bash "$ROOT/recipe/rpg/cpu/run_rpg_reinforce_urkl.sh" trainer.val_before_train=True "trainer.save_freq=$CPU_STEPS" \
  "actor_rollout_ref.rollout.val_kwargs.n=${DEMO_VAL_N:-4}" "$@" 2>&1 \
  | "$PY" -m rpg.cpu.progress "$OUT/console.log" --steps "$CPU_STEPS"
rc=${PIPESTATUS[0]}
set -e
if [[ "$rc" != 0 ]]; then
  echo "[demo] the trainer failed (exit $rc); see $OUT/console.log" >&2
  exit "$rc"
fi

"$PY" -m rpg.tools.report "rpg_reinforce_urkl=$VERL_FILE_LOGGER_PATH" --out "$OUT"
echo "[demo] evaluating the final checkpoint with rpg-evaluate ..."
"$PY" -m rpg.tools.evaluate --model "$CKPTS_DIR" --data "$ROOT/artifacts/tiny/val.parquet" \
  --k "${DEMO_EVAL_K:-${DEMO_VAL_N:-4}}" --max-prompt-length 48 --max-tokens "${CPU_RESPONSE_LEN:-48}" \
  --seed "$CPU_SEED" --out "$OUT/eval" >/dev/null
"$PY" - "$VERL_FILE_LOGGER_PATH" "$(( $(date +%s) - start ))" "$OUT/eval/results.json" <<'EOF'
import json, re, sys
val = {}
for line in open(sys.argv[1]):
    rec = json.loads(line)
    for key, value in rec["data"].items():
        if re.match(r"^val-core/.+/acc/mean@\d+$", key):
            val[rec["step"]] = (key, value)
if len(val) < 2:
    sys.exit(f"[demo] expected validations before and after training in {sys.argv[1]}, found steps {sorted(val)}")
first, last = min(val), max(val)
key = val[first][0]
print(f"[demo] {key}: step {first} {val[first][1]:.1%} -> step {last} {val[last][1]:.1%} "
      f"({100 * (val[last][1] - val[first][1]):+.1f} points); wall time {int(sys.argv[2]) // 60} min "
      f"{int(sys.argv[2]) % 60} s")
ev = json.load(open(sys.argv[3]))
r, k = ev["results"]["math_dapo"], ev["sampling"]["k"]
print(f"[demo] rpg-evaluate, checkpoint of step {ev['model']['step']}, fresh samples: mean@{k} {r['mean@k']:.1%} "
      f"± {100 * r['se']:.1f} points (s.e. over problems) vs in-training validation at step {last} {val[last][1]:.1%}")
EOF
echo "[demo] curves: $OUT/curves.png  table: $OUT/table.md  metrics: $VERL_FILE_LOGGER_PATH  evaluation: $OUT/eval"
