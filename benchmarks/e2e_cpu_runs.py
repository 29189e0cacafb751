#!/usr/bin/env python
"""End-to-end CPU measurements with verl's real trainer on the tiny task (run them one at a time; each takes minutes).

    python benchmarks/e2e_cpu_runs.py compare   [--steps 50] [--seed 0] [--out artifacts/cpu-compare]
                                                [--reuse rpg_reinforce_urkl=artifacts/demo/metrics.jsonl]
    python benchmarks/e2e_cpu_runs.py step-time [--steps 12] [--seed 0] [--out artifacts/bench]
    python benchmarks/e2e_cpu_runs.py beta-sweep [--steps 20] [--seeds 0 1] [--betas 0 0.03 0.3 3]
                                                 [--out artifacts/beta-sweep] [--resume | --plot-only]
    python benchmarks/e2e_cpu_runs.py real-model [--steps 20] [--seeds 0 1] [--out artifacts/real-model] [--resume]
                                                 [--plot-only]

``compare``: RPG-REINFORCE-URKL, GRPO and DAPO (recipe/rpg/cpu/run_*.sh, i.e. each method's GPU recipe with only the
sizes changed by the CPU profile) with the same seed, steps, data and validation (before training and every 10 steps,
4 samples per held-out prompt), then one figure and a Last/Best table with rpg.tools.report, and ``summary.json`` with
validation accuracy before/after and wall time per method.

``step-time``: RPG-REINFORCE-URKL with the iterative reference (π_ref = π_old: no reference model, no
``timing_s/ref``) against the frozen reference (verl's reference worker computes ``ref_log_prob`` every step:
``reference=frozen``, ``use_kl_loss=True``, ``kl_loss_coef=0``). No validation and no group filtering, so every step
does the same work; reports the mean ``timing_s/step`` over steps >= 3 and the ratio, to ``step_time.json``.

``beta-sweep``: the KL add-on over verl's vanilla loss (`rpg_kl_urkl`, docs/losses.md#kl-addon: RPG-URKL's gradient)
against the frozen initial model (verl's reference worker), with the KL sampled (one token per position) and computed
at the top-k = 8 tokens with the sampled tail (docs/losses.md#topk-kl), for each β and seed (β = 0 once per seed:
no KL, the estimators coincide). 8 prompts × 8 responses, two updates per step, validation before training and every
10 steps (4 samples per held-out prompt). Writes ``sweep.json`` (per run: validation accuracy before/after, the mean
over the last 5 steps of ``actor/rpg/kl`` (the KL to the reference), ``actor/rpg/kl_share`` and reward) and
rpg.tools.report's figures of all runs (``curves.png``, ``diagnostics.png``), and ``sweep.png``: accuracy and KL
against β for both estimators, and the KL-share curves. ``--plot-only`` runs nothing and draws the finished runs.

``real-model``: RPG-REINFORCE-URKL against GRPO on a real pretrained model (docs/benchmarks.md#real-model):
SmolLM2-135M-Instruct on one-digit addition through recipe/rpg/cpu/smollm2.sh, each seed of ``--seeds`` for each
method, with the settings of ``REAL_MODEL`` (fixed before the runs; validation before training and every
``test_freq`` steps). Each run keeps its final actor as a Hugging Face folder; then ``rpg-evaluate`` gives mean@k ± s.e.
of the initial model and of every final actor on the validation problems (hf engine, one seed: paired), and
``rpg-report`` the curves. Writes ``real_model.json`` in ``--out`` and the committed record
``benchmarks/records/real_model.json`` (settings, per run the validation curve, wall and step seconds, the final
evaluation; the initial evaluation) with the figure ``docs/img/real-model-curves.png``. ``--resume`` keeps every run
whose metrics reach the last step and whose final actor was saved, and every finished evaluation.

Outputs are written atomically; per-run console logs and metrics (verl's file logger) stay next to them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from rpg.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from rpg.tools import evaluate, prepare_data, prepare_model, report, tiny_model

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipe" / "rpg" / "cpu"
COMPARE = {"rpg_reinforce_urkl": "run_rpg_reinforce_urkl.sh", "grpo": "run_grpo.sh", "dapo": "run_dapo.sh"}
FROZEN_REF = ["+actor_rollout_ref.actor.policy_loss.reference=frozen", "actor_rollout_ref.actor.use_kl_loss=True",
              "actor_rollout_ref.actor.kl_loss_coef=0.0"]
STEP_TIME = {"iterative": [], "frozen": FROZEN_REF}


@contextlib.contextmanager
def locked(lock: Optional[Path]):
    """Hold `lock`'s flock(2) (what ``flock LOCK <command>`` takes) for the block; no-op for None."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def read_records(path: Path) -> list[dict]:
    """verl's file-logger records (one JSON object per line) of `path`."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(script: str, name: str, out: Path, env_update: dict, overrides: list[str],
        lock: Optional[Path] = None) -> tuple[list[dict], float]:  # fmt: skip
    """One trainer run; returns (file-logger records, wall seconds). Raises with the log tail on failure.

    `lock`: hold this file's flock during the run (machines shared with other trainer jobs); waiting for it is not
    part of the wall time.
    """
    metrics, console = out / f"{name}.jsonl", out / f"{name}.console.log"
    metrics.unlink(missing_ok=True)
    env = dict(os.environ, EXP_NAME=name, VERL_FILE_LOGGER_PATH=str(metrics), **env_update)
    print(f"[e2e_cpu_runs] {name}: {script} {' '.join(overrides)}", flush=True)
    with locked(lock):
        t0 = time.time()
        with open(console, "w") as f:
            rc = subprocess.run(["nice", "-n", "10", "bash", str(RECIPES / script), *overrides], cwd=ROOT, env=env,
                                stdout=f, stderr=subprocess.STDOUT).returncode
        wall = time.time() - t0
    if rc != 0:
        tail = "\n".join(console.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{name} failed (exit {rc}); see {console}\n{tail}")
    print(f"[e2e_cpu_runs] {name}: done in {wall:.0f} s", flush=True)
    return read_records(metrics), wall


def validation(records: list[dict]) -> dict[int, float]:
    return {r["step"]: v for r in records for k, v in r["data"].items()
            if k.startswith("val-core/") and "/acc/mean@" in k}


def compare(args) -> dict:
    env = {"CPU_STEPS": str(args.steps), "CPU_TEST_FREQ": "10", "CPU_SEED": str(args.seed)}
    overrides = ["trainer.val_before_train=True", "actor_rollout_ref.rollout.val_kwargs.n=4"]
    summary, specs = {}, []
    reuse = dict(spec.split("=", 1) for spec in args.reuse)
    unknown = set(reuse) - set(COMPARE)
    if unknown:
        raise SystemExit(f"--reuse: unknown method(s) {sorted(unknown)}; choose from {sorted(COMPARE)}")
    for name, script in COMPARE.items():
        if name in reuse:  # a finished run with the same settings (e.g. scripts/demo_cpu.sh's metrics.jsonl)
            path = Path(reuse[name])
            records, wall = read_records(path), None
            atomic_write_text(args.out / f"{name}.jsonl", path.read_text())
        else:
            records, wall = run(script, name, args.out, env, overrides)
        val = validation(records)
        steps = [r["data"]["timing_s/step"] for r in records if "timing_s/step" in r["data"] and r["step"] >= 2]
        summary[name] = {"val_acc_before": val[min(val)], "val_acc_after": val[max(val)], "val_acc": val,
                         "wall_s": None if wall is None else round(wall, 1),
                         "mean_step_s": round(statistics.mean(steps), 3)}
        specs.append(f"{name}={args.out / (name + '.jsonl')}")
    if report.main([*specs, "--out", str(args.out)]) != 0:
        raise SystemExit("[e2e_cpu_runs] the report failed")
    return summary


def step_time(args) -> dict:
    env = {"CPU_STEPS": str(args.steps), "CPU_TEST_FREQ": "-1", "CPU_SEED": str(args.seed)}
    overrides = ["trainer.val_before_train=False", "algorithm.filter_groups.enable=False"]
    summary = {}
    for name, extra in STEP_TIME.items():
        records, wall = run("run_rpg_reinforce_urkl.sh", f"steptime_{name}", args.out, env, overrides + extra)
        steps = [r["data"] for r in records if "timing_s/step" in r["data"] and r["step"] >= 3]
        summary[name] = {"mean_step_s": round(statistics.mean(d["timing_s/step"] for d in steps), 3),
                         "mean_ref_s": round(statistics.mean(d.get("timing_s/ref", 0.0) for d in steps), 3),
                         "has_timing_ref": any("timing_s/ref" in d for d in steps), "steps_measured": len(steps),
                         "wall_s": round(wall, 1)}
    summary["ratio_frozen_over_iterative"] = round(summary["frozen"]["mean_step_s"]
                                                  / summary["iterative"]["mean_step_s"], 3)
    return summary


SWEEP = ["actor_rollout_ref.actor.policy_loss.loss_mode=rpg_kl_urkl",
         "+actor_rollout_ref.actor.policy_loss.base_loss_mode=vanilla", *FROZEN_REF, "trainer.val_before_train=True", "actor_rollout_ref.rollout.val_kwargs.n=4"]
ESTIMATORS = {"sampled": [], "topk": ["+actor_rollout_ref.actor.policy_loss.kl_estimator=topk",
                                      "+actor_rollout_ref.actor.policy_loss.kl_topk=8"]}


def last_mean(records: list[dict], key: str, n: int = 5) -> Optional[float]:
    values = [r["data"][key] for r in records if key in r["data"]][-n:]
    return round(statistics.mean(values), 6) if values else None


def beta_sweep(args) -> dict:
    env = {"CPU_STEPS": str(args.steps), "CPU_TEST_FREQ": "10", "CPU_BATCH": "8", "CPU_N": "8", "CPU_MINI_BATCH": "4"}
    summary, specs, curves = {}, [], {}
    for seed in args.seeds:
        for beta in args.betas:
            for estimator, extra in ESTIMATORS.items():
                if beta == 0 and estimator != "sampled":
                    continue  # no KL term: the estimators coincide
                name = f"beta{beta:g}_{estimator if beta else 'none'}_s{seed}"
                metrics = args.out / f"{name}.jsonl"
                records = read_records(metrics) if (args.resume or args.plot_only) and metrics.exists() else []
                wall = None
                if args.plot_only and max((r["step"] for r in records), default=0) < args.steps:
                    continue  # --plot-only: the finished runs only
                if max((r["step"] for r in records), default=0) < args.steps:  # absent, or cut short: run it
                    records, wall = run("run_rpg_reinforce_urkl.sh", name, args.out, {**env, "CPU_SEED": str(seed)},
                                        [*SWEEP, f"recipe.beta={beta:g}", *extra])  # fmt: skip
                val = validation(records)
                summary[name] = {"beta": beta, "estimator": estimator if beta else "none", "seed": seed,
                                 "val_acc_before": val[min(val)], "val_acc_after": val[max(val)],
                                 "kl_last5": last_mean(records, "actor/rpg/kl"),
                                 "kl_share_last5": last_mean(records, "actor/rpg/kl_share"),
                                 "reward_last5": last_mean(records, "critic/score/mean"),
                                 "wall_s": None if wall is None else round(wall, 1)}
                specs.append(f"{name}={metrics}")
                curves[name] = [(r["step"], r["data"]["actor/rpg/kl_share"]) for r in records
                                if "actor/rpg/kl_share" in r["data"]]  # fmt: skip
    if not summary:
        raise SystemExit(f"[e2e_cpu_runs] no finished run in {args.out}")
    if report.main([*specs, "--out", str(args.out)]) != 0:
        raise SystemExit("[e2e_cpu_runs] the report failed")
    sweep_figure(summary, curves, args.out / "sweep.png")
    return summary


def sweep_figure(summary: dict, curves: dict, path: Path) -> None:
    """Three panels from the runs of `summary`: final validation accuracy against β, the KL to the reference
    (mean of the last 5 steps) against β, both with the sampled and the top-k estimator (a marker per seed), and
    `actor/rpg/kl_share` per step (colour: β; line: estimator). β = 0 is drawn at the left end of the β axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    betas = sorted({run["beta"] for run in summary.values()})
    x = {beta: i for i, beta in enumerate(betas)}
    colours = dict(zip(betas, plt.get_cmap("viridis")([i / max(1, len(betas) - 1) for i in range(len(betas))])))
    styles = {"none": ("k", "-"), "sampled": ("tab:blue", "-"), "topk": ("tab:orange", "--")}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for col, (key, title) in enumerate((("val_acc_after", "validation accuracy, step 20 (mean@4)"),
                                        ("kl_last5", "KL to the reference, last 5 steps"))):  # fmt: skip
        ax = axes[col]
        for estimator in ("sampled", "topk"):
            runs = [r for r in summary.values() if r["estimator"] in (estimator, "none") and r[key] is not None]
            for seed in sorted({r["seed"] for r in runs}):
                pts = sorted((x[r["beta"]], r[key]) for r in runs if r["seed"] == seed)
                ax.plot(*zip(*pts), styles[estimator][1], marker="os^v"[seed % 4], color=styles[estimator][0],
                        label=f"{estimator}, seed {seed}")  # fmt: skip
        ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax.set_xlabel("β")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    ax = axes[2]
    for name, points in curves.items():
        run = summary[name]
        if points and run["beta"] > 0:
            ax.plot(*zip(*points), styles[run["estimator"]][1], color=colours[run["beta"]], lw=1,
                    label=f"β={run['beta']:g} {run['estimator']} s{run['seed']}")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_title("KL gradient share (actor/rpg/kl_share)", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".tmp.png"), dpi=90)  # then renamed: written atomically
    plt.close(fig)
    os.replace(path.with_suffix(".tmp.png"), path)


# The real-model comparison's settings, fixed before the runs (docs/benchmarks.md#real-model).
REAL_MODEL = {"CPU_BATCH": "4", "CPU_N": "8", "CPU_MINI_BATCH": "2", "CPU_LR": "2e-5", "CPU_RESPONSE_LEN": "48",
              "CPU_TEST_FREQ": "10", "OLD_LOGPROB": "rollout", "OMP_NUM_THREADS": "2"}
REAL_MODEL_VAL_N, REAL_MODEL_EVAL_K = 2, 4
REAL_MODEL_METHODS = ("rpg_reinforce_urkl", "grpo")
REAL_MODEL_DATA = ROOT / "data" / "arith-add1-short"
RECORDS = ROOT / "benchmarks" / "records"
FIGURE = ROOT / "docs" / "img" / "real-model-curves.png"


DOCS = ROOT / "docs" / "benchmarks.md"
TABLE_START, TABLE_END = "<!-- real-model-record -->", "<!-- /real-model-record -->"


def real_model_table(record: dict) -> str:
    """The docs' table of a real-model record (docs/benchmarks.md#real-model; tests/test_real_model_record_on_cpu.py
    checks that the docs hold exactly this): per run the in-training validation, the final rpg-evaluate mean@k ± s.e.
    and its change from the initial model in standard errors (the larger s.e. of the two), the step and wall time."""
    init, k = record["initial"], record["settings"]["eval_k"]
    n = record["settings"]["val_kwargs.n"]
    lines = [f"| run | validation mean@{n} by step | rpg-evaluate mean@{k} ± s.e. | final − initial | "
             "≥ 2 s.e.? | s per step | wall |",
             "|---|---|---|---|---|---|---|",
             f"| initial model | | {init['mean@k']:.3f} ± {init['se']:.3f} | | | | |"]
    for name, run in sorted(record["runs"].items()):
        curve = ", ".join(f"{step}: {acc:.2f}" for step, acc in sorted((int(s), a) for s, a in run["val_acc"].items()))
        final = run["final"]
        delta, se = final["mean@k"] - init["mean@k"], max(final["se"], init["se"])
        wall = "" if run["wall_s"] is None else f"{run['wall_s'] / 60:.0f} min"
        lines.append(f"| {name} | {curve} | {final['mean@k']:.3f} ± {final['se']:.3f} | {delta:+.3f} "
                     f"({delta / se:+.1f} s.e.) | {'yes' if delta >= 2 * se else 'no'} | {run['mean_step_s']:.0f} | "
                     f"{wall} |")
    lines += ["", "![Validation accuracy, reward, entropy and response length of the runs against step]"
                  "(img/real-model-curves.png)"]
    return "\n".join(lines)


def write_docs_table(record: dict) -> None:
    """Replace the block between the docs' markers with `real_model_table(record)` (atomically)."""
    text = DOCS.read_text()
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    atomic_write_text(DOCS, f"{head}{TABLE_START}\n{real_model_table(record)}\n{TABLE_END}{tail}")


def final_actor(ckpt: Path, steps: int) -> Path:
    """The Hugging Face folder of a run's last checkpoint (``save_contents`` with ``hf_model``)."""
    return ckpt / f"global_step_{steps}" / "actor" / "huggingface"


def evaluate_model(model: Path, name: str, out: Path, resume: bool) -> dict:
    """rpg-evaluate's mean@k ± s.e. of `model` on the validation problems (hf engine, seed 0, 2 threads)."""
    results = out / f"eval_{name}" / "results.json"
    if not (resume and results.is_file()):
        argv = ["--model", str(model), "--data", str(REAL_MODEL_DATA / "val.parquet"), "--k", str(REAL_MODEL_EVAL_K),
                "--max-tokens", REAL_MODEL["CPU_RESPONSE_LEN"], "--max-prompt-length", "48", "--engine", "hf",
                "--threads", "2", "--batch-size", "64", "--seed", "0", "--out", str(results.parent)]
        print(f"[e2e_cpu_runs] evaluating {name}: rpg-evaluate {' '.join(argv)}", flush=True)
        if evaluate.main(argv) != 0:
            raise SystemExit(f"[e2e_cpu_runs] rpg-evaluate failed for {name}")
    source = json.loads(results.read_text())["results"]["last_number"]
    return {key: source[key] for key in ("mean@k", "se", "se_sampling", "best@k", "n_problems", "n_samples")}


def real_model(args) -> dict:
    env = dict(REAL_MODEL, CPU_STEPS=str(args.steps))
    summary = {"settings": {**REAL_MODEL, "CPU_STEPS": args.steps, "val_kwargs.n": REAL_MODEL_VAL_N,
                            "eval_k": REAL_MODEL_EVAL_K, "seeds": args.seeds}, "runs": {}}
    specs = []
    summary["initial"] = evaluate_model(ROOT / "artifacts" / "smollm2-135m", "initial", args.out, args.resume)
    for seed in args.seeds:
        for method in REAL_MODEL_METHODS:
            name = f"{method}_s{seed}"
            metrics, ckpt = args.out / f"{name}.jsonl", args.out / "ckpt" / name
            records = read_records(metrics) if (args.resume or args.plot_only) and metrics.exists() else []
            done = max((r["step"] for r in records), default=0) >= args.steps
            wall_file = args.out / f"{name}.wall.json"  # the wall time of a finished run, for --resume
            wall = json.loads(wall_file.read_text())["wall_s"] if done and wall_file.is_file() else None
            if not (done and final_actor(ckpt, args.steps).is_dir()):
                if args.plot_only:
                    continue
                overrides = [method, "trainer.val_before_train=True",
                             f"actor_rollout_ref.rollout.val_kwargs.n={REAL_MODEL_VAL_N}",
                             f"trainer.save_freq={args.steps}", f"trainer.default_local_dir={ckpt}",
                             "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]"]
                records, wall = run("smollm2.sh", name, args.out, {**env, "CPU_SEED": str(seed)}, overrides)
                atomic_write_json(wall_file, {"wall_s": wall})
            val = validation(records)
            steps = [r["data"]["timing_s/step"] for r in records if "timing_s/step" in r["data"] and r["step"] >= 2]
            summary["runs"][name] = {
                "method": method, "seed": seed, "val_acc": val, "val_acc_before": val[min(val)],
                "val_acc_after": val[max(val)], "mean_step_s": round(statistics.mean(steps), 1),
                "wall_s": None if wall is None else round(wall, 1),
                "reward": {r["step"]: round(r["data"]["critic/score/mean"], 4) for r in records
                           if "critic/score/mean" in r["data"]},
                "final": evaluate_model(final_actor(ckpt, args.steps), name, args.out, args.resume)}
            specs.append(f"{name}={metrics}")
    if not summary["runs"]:
        raise SystemExit(f"[e2e_cpu_runs] no finished run in {args.out}")
    if report.main([*specs, "--out", str(args.out)]) != 0:
        raise SystemExit("[e2e_cpu_runs] the report failed")
    summary = json.loads(json.dumps(summary))  # the record as read back (step keys as strings)
    atomic_write_json(RECORDS / "real_model.json", summary, indent=1, sort_keys=True)
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(FIGURE, (args.out / "curves.png").read_bytes())
    write_docs_table(summary)
    print(real_model_table(summary))
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["compare", "step-time", "beta-sweep", "real-model"])
    ap.add_argument("--steps", type=int, default=None, help="training steps (compare: 50, step-time: 12, beta-sweep: 20, real-model: 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="beta-sweep: the seeds")
    ap.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.03, 0.3, 3.0], help="beta-sweep: the β values")
    ap.add_argument("--resume", action="store_true",
                    help="beta-sweep, real-model: keep the runs that reached the last step (and their evaluations)")
    ap.add_argument("--plot-only", action="store_true",
                    help="beta-sweep: run nothing; sweep.json and the figures from the finished runs in --out")
    ap.add_argument("--out", type=Path, default=None, help="artifacts/cpu-compare or artifacts/bench")
    ap.add_argument("--reuse", action="append", default=[], metavar="METHOD=JSONL",
                    help="compare: use this finished run's metrics instead of running METHOD (same settings!)")
    args = ap.parse_args(argv)
    args.steps = args.steps or {"compare": 50, "step-time": 12, "beta-sweep": 20, "real-model": 20}[args.what]
    default_out = {"compare": "cpu-compare", "step-time": "bench", "beta-sweep": "beta-sweep",
                   "real-model": "real-model"}[args.what]
    args.out = (args.out or ROOT / "artifacts" / default_out).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what != "real-model" and tiny_model.main(["--out", str(ROOT / "artifacts" / "tiny")]) != 0:
        raise SystemExit("[e2e_cpu_runs] building the tiny model failed")
    if args.what == "real-model" and not args.plot_only:
        if prepare_model.main(["--out", str(ROOT / "artifacts" / "smollm2-135m")]) != 0:
            raise SystemExit("[e2e_cpu_runs] preparing the model failed")
        if prepare_data.main(["arith-add1-short", "--out-dir", str(REAL_MODEL_DATA.parent)]) != 0:
            raise SystemExit("[e2e_cpu_runs] preparing the task failed")
    summary = {"compare": compare, "step-time": step_time, "beta-sweep": beta_sweep,
               "real-model": real_model}[args.what](args)
    name = {"compare": "summary.json", "step-time": "step_time.json", "beta-sweep": "sweep.json",
            "real-model": "real_model.json"}[args.what]
    atomic_write_json(args.out / name, summary, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
