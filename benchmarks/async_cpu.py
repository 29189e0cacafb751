#!/usr/bin/env python
"""π_old without an extra forward pass, and the asynchronous trainer, on the CPU recipe (each run takes minutes).

    python benchmarks/async_cpu.py [--steps 6] [--seed 0] [--lock FILE] [--out artifacts/bench-async]

Three runs of recipe/rpg/cpu/run_rpg_reinforce_urkl.sh (RPG-REINFORCE-URKL, iterative reference; the hf rollout) with
the same seed, data, sizes and steps (16 prompts × 8 responses, two updates per step), validation after the last step
only (200 held-out prompts, one sample each):

* ``sync+recompute``: the paper's setting (verl's sync trainer, the actor recomputes π_old = ``old_log_prob``);
* ``bypass``: sync trainer, π_old := the rollout's log-probs (``algorithm.rollout_correction.bypass_mode=True``), no
  old-log-prob forward (docs/async.md#bypass);
* ``colocate_async``: verl's colocated asynchronous trainer (``trainer.v1.trainer_mode=colocate_async``, one batch
  generated ahead, partial rollouts through the hf server's abort/resume), π_old recomputed.

Per run it prints the mean over steps >= 2 (step 1 carries the start-up) of ``timing_s/step``, ``timing_s/gen``,
``timing_s/old_log_prob`` and ``timing_s/update_actor`` in seconds, the mean staleness
(``training/off_policy/trajectory_staleness/mean``, weight versions), the wall time of the whole command, the host's
load average before the run, and the final validation accuracy (``val-core/math_dapo/acc/mean@1``). On a shared
machine the load inflates every figure; compare runs taken under similar load. ``summary.json`` (atomic) in ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_cpu_runs import ROOT, run  # noqa: E402

from rpg.atomic import atomic_write_json  # noqa: E402

MODES = {
    "sync+recompute": [],
    "bypass": ["algorithm.rollout_correction.bypass_mode=True"],
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
}
TIMINGS = ("step", "gen", "old_log_prob", "update_actor")
VAL_KEY = "val-core/math_dapo/acc/mean@1"
STALENESS = "training/off_policy/trajectory_staleness/mean"


def summarise(records: list[dict]) -> dict:
    """Means over the training steps >= 2 of the timings and the staleness, and the last validation accuracy."""
    train = [r["data"] for r in records if "timing_s/step" in r["data"] and "actor/pg_loss" in r["data"]
             and r["step"] >= 2]  # fmt: skip
    if not train:
        raise RuntimeError("no training step >= 2 was logged; run with --steps >= 2")
    out = {k: statistics.mean(d.get(f"timing_s/{k}", 0.0) for d in train) for k in TIMINGS}
    out["staleness"] = statistics.mean(d.get(STALENESS, float("nan")) for d in train)
    val = [r["data"][VAL_KEY] for r in records if VAL_KEY in r["data"]]
    out["val_acc"] = val[-1] if val else float("nan")
    out["steps_measured"] = len(train)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="training steps per run (>= 2; step 1 is not averaged)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--lock", type=Path, default=None, help="hold this file's flock during each run")
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts" / "bench-async")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (step 1 includes the start-up and is not averaged)")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(CPU_STEPS=str(args.steps), CPU_TEST_FREQ=str(args.steps), CPU_MINI_BATCH="8", CPU_SEED=str(args.seed))
    results = {}
    for mode in args.modes:
        name = mode.replace("+", "_")
        load = os.getloadavg()[0]
        records, wall = run("run_rpg_reinforce_urkl.sh", name, args.out, env,
                            ["trainer.val_before_train=False", *MODES[mode]], lock=args.lock)
        results[mode] = {**summarise(records), "wall": wall, "load": load}
    cols = ("step", "gen", "old_log_prob", "update_actor", "staleness", "val_acc", "wall", "load")
    print(f"\nRPG-REINFORCE-URKL, CPU recipe, {args.steps} steps, seed {args.seed}; seconds (means over steps >= 2)")
    print(f"{'mode':16}" + "".join(f"{c:>14}" for c in cols))
    for mode, r in results.items():
        print(f"{mode:16}" + "".join(f"{r[c]:14.3f}" for c in cols))
    atomic_write_json(args.out / "summary.json", {"steps": args.steps, "seed": args.seed, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
