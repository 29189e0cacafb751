"""The group optim=schedulefree (rpg/config/optim/schedulefree.yaml) through the real launcher: one script passes a
full `RPG_DRY_RUN=1` in a fresh Python (the trainer is registered in every Ray process by RPG_INSTALL=schedule_free,
rpg/install.py).

What every `*_schedulefree*` script selects (schedule-free AdamW, the `schedule_free_sync` trainer, its RPG_INSTALL name in
every process) is checked in tests/recipes/test_dry_run_on_cpu.py with every other check of every script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import rpg.schedule_free as sfm
from rpg.tools.dry_run_digest import recipe_env

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_in_a_fresh_process():
    script = REPO / "recipe" / "rpg" / "7b" / "run_rpg_7b_urkl1e-4_schedulefree.sh"
    env = recipe_env(RPG_DRY_RUN="1", PYTHON=sys.executable)  # GPU scripts run python3 unless PYTHON is set
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"trainer_mode: {sfm.TRAINER_MODE}" in proc.stdout
    assert "optimizer: AdamWScheduleFree" in proc.stdout
