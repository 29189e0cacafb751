# shellcheck shell=bash
# The one launcher of the RPG recipes. Sourced (never executed) by every experiment script, with the script's line of
# Hydra config-group choices (rpg/config/: setup, method, optim, profile) and the user's arguments:
#
#     source "$(dirname "${BASH_SOURCE[0]}")/../common.sh" setup=qwen3_4b_4k method=rpg_reinforce \
#         recipe.divergence=urkl recipe.beta=1e-4 "$@"
#
# It only chooses the interpreter and execs `python -m rpg.preflight.recipe_argv` with this checkout first on
# PYTHONPATH (the module imports the standard library and rpg's run-mode table, never verl), which reads the
# environment knobs, refuses an exported recipe setting (LR, KL_COEF, ...: pass the Hydra override it names instead),
# then runs `python -m rpg.launch <overrides> <choices> "$@"` here, prints it (RPG_PRINT_ARGV=1), or submits it to the
# Ray cluster at RAY_ADDRESS. The knobs: recipe/rpg/README.md#knobs-environment-variables (or
# PYTHONPATH=. python3 -m rpg.preflight.recipe_argv --markdown).
# PYTHON: the interpreter of the launch (GPU: python3 from your environment; CPU profile: the repository's .venv).
_rpg_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec env PYTHONPATH="$_rpg_dir${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m rpg.preflight.recipe_argv \
  --repo "$_rpg_dir" --script "$(basename "${BASH_SOURCE[1]:-rpg_run}" .sh)" -- "$@"
