"""Smoke mode (`SMOKE=1 bash recipe/rpg/<dir>/run_*.sh`): the recipe as it is, for 2 steps, then a report.

A smoke run keeps what can fail on a cluster (model, engines, ranks, memory settings, per-GPU token budgets, the
configured loggers) and shrinks what costs time: 2 steps on the smallest batch that fills every rank's micro-batches,
one short validation. It goes through the moments that otherwise fail late, in two launches as a user's run and its
resume would be:

1. launch 1 (`RPG_SMOKE_PHASE=save`): step 1, then a checkpoint under the smoke folder (`RPG_SMOKE_DIR`/ckpts/<exp>,
   never the run's CKPTS_DIR: it must neither replace a user's checkpoint nor be resumed by the real run); every mode
   the recipe selects acts at each step, as its row of the run-mode table says (`rpg.modes.smoke_overrides`): the
   periodic reference is refreshed (K = 1) and the EMA reference blended (P = 1) at every step, and each rank checks
   every write (`VERIFY_REFRESH_ENV`: the copy equals the actor, rpg/reference/periodic.py; Σ new = τ·Σ old +
   (1 − τ)·Σ actor, rpg/reference/ema.py); with schedule-free the checkpoint includes the HF export of the
   average x (rpg/schedule_free.py);
2. launch 2 (`RPG_SMOKE_PHASE=resume`): resumes that checkpoint (`resume_mode=auto`), runs step 2 and validates.

`SMOKE_ROLLOUT=full` (GPU only) keeps the recipe's batch, so the rollout decodes the full `train_batch_size ×
rollout.n` sequences and reaches the KV-cache and sampler peak. `run_launches` (below; called by `rpg.launch`) runs both
launches with a `GpuMemorySampler` started, then prints `summarize(logs, validated recipe, sampler, wall seconds)`:
per phase the seconds per step and the measured peak memory, and the projected wall time of the full run. The recipe
is the launcher's `ValidatedConfig` (`rpg.launch.validate`) without the smoke overrides: its typed RPG settings say
which modes the smoke run forces, its typed checkpoint settings what schedule-free's checkpoint adds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from rpg import modes
from rpg.mismatch import report_lines
from rpg.preflight.disk import GB, estimate
from rpg.preflight.memory_config import smoke_comparison
from rpg.preflight.recipe_argv import hydra_str
from rpg.preflight.verl_configs import ValidatedConfig

SMOKE_ENV = "SMOKE"
ROLLOUT_ENV = "SMOKE_ROLLOUT"  # small (default) | full
PHASE_ENV = "RPG_SMOKE_PHASE"  # set by the launcher for its two launches
SAVE, RESUME = "save", "resume"
VERIFY_REFRESH_ENV = modes.VERIFY_ENV  # read by the reference modes' state in the workers (rpg/reference/written.py)
MARKER = ".rpg-smoke"  # marks a smoke checkpoint folder (a later smoke run may replace it)
SMOKE_STEPS, SMOKE_TEST_FREQ = 2, 2  # validate once, after step 2 (verl validates on the last step if test_freq > 0)
#: the trainer settings of launch 1 (step 1, a checkpoint, no validation) and launch 2 (resume, step 2, validation)
SAVE_LAUNCH = ("trainer.total_training_steps=1", "trainer.test_freq=-1", "trainer.save_freq=1",
               "trainer.resume_mode=disable")
RESUME_LAUNCH = (f"trainer.total_training_steps={SMOKE_STEPS}", f"trainer.test_freq={SMOKE_TEST_FREQ}",
                 "trainer.save_freq=-1", "trainer.resume_mode=auto")
GIB = 1024**3
# verl's v1 trainer times these sections of a step (timing_s/<key>): (label, key, scaled with the batch); None: the
# rollout, between ×1 (one parallel decode) and ×scale (linear)
PHASES = (("rollout (gen)", "gen", None), ("reward", "reward", True), ("old log-prob", "old_log_prob", True),
          ("reference", "ref", True), ("advantage", "adv", True), ("update", "update_actor", True),
          ("weight sync", "update_weights", False))


def smoke_requested(environ=os.environ) -> bool:
    value = environ.get(SMOKE_ENV, "").strip().lower()
    if value not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(f"{SMOKE_ENV}={environ[SMOKE_ENV]!r} is not valid; use 1 (smoke run) or 0")
    return value in ("1", "true", "yes", "on")


def smoke_rollout(environ=os.environ) -> str:
    """`SMOKE_ROLLOUT`: "small" (default: the smallest batch that fills every rank) or "full" (the recipe's batch)."""
    value = environ.get(ROLLOUT_ENV, "").strip().lower() or "small"
    if value not in ("small", "full"):
        raise ValueError(f"{ROLLOUT_ENV}={environ[ROLLOUT_ENV]!r} is not valid; use small (default) or full (the "
                         "recipe's whole batch: the rollout's KV-cache and sampler peak, GPU runs only)")
    return value


def uses_schedule_free(config) -> bool:
    return modes.trainer_mode(config).schedule_free


@dataclasses.dataclass(frozen=True)
class SmokePaths:
    """Where a smoke run of experiment `exp` writes, under the smoke folder `root`."""

    root: Path
    exp: str

    @property
    def log(self) -> Path:  # launch 2 (resume): step 2 and the validation
        return self.root / f"{self.exp}.jsonl"

    @property
    def step1_log(self) -> Path:  # launch 1 (save): step 1 (verl's file logger truncates its file)
        return self.root / f"{self.exp}.step1.jsonl"

    @property
    def ckpts(self) -> Path:
        return self.root / "ckpts" / self.exp

    def phase_log(self, phase: str) -> Path:
        return self.step1_log if phase == SAVE else self.log


def smoke_paths(full: ValidatedConfig, log_dir: os.PathLike | str) -> SmokePaths:
    """The smoke folder `log_dir` of the validated recipe `full` (its experiment's name)."""
    return SmokePaths(Path(log_dir).resolve(), str(full.config.trainer.experiment_name))


def _world(config) -> int:
    return int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)


def _val_smoke(config) -> int:
    return max(8, _world(config))  # validation prompts of a smoke run: 8, or one per GPU


def smoke_batch_size(config) -> int:
    """The fewest prompts P such that P × rollout.n sequences fill every data-parallel rank's micro-batches.

    dp = world / ulysses_sequence_parallel_size. Each rank needs `fill` sequences: the largest micro-batch per GPU
    (actor, rollout log-prob, reference) with a static batch, or, with dynamic batches, the maximal-length sequences
    (max_prompt_length + max_response_length) that fill the largest per-GPU token budget. verl needs P × n divisible
    by the world size and, with a static batch, each rank's share divisible by the actor's micro-batch.
    """
    arr, world = config.actor_rollout_ref, _world(config)
    n, dp = int(arr.rollout.n), world // int(arr.actor.get("ulysses_sequence_parallel_size", 1) or 1)
    micro = int(arr.actor.ppo_micro_batch_size_per_gpu or 1)
    if arr.actor.use_dynamic_bsz:
        seq = int(config.data.max_prompt_length) + int(config.data.max_response_length)
        budgets = (arr.actor.ppo_max_token_len_per_gpu, arr.rollout.log_prob_max_token_len_per_gpu,
                   arr.ref.log_prob_max_token_len_per_gpu)
        fill, multiple = max(math.ceil(int(b) / seq) for b in budgets if b), 1
    else:
        sizes = (micro, arr.rollout.log_prob_micro_batch_size_per_gpu, arr.ref.log_prob_micro_batch_size_per_gpu)
        fill, multiple = max(int(s) for s in sizes if s), micro
    p = 1
    while (p * n) % world or (p * n) // dp < fill or ((p * n) // dp) % multiple:
        p += 1
    return p


def _loggers(config) -> list[str]:
    """The recipe's loggers, plus console and verl's file logger (the report reads its log)."""
    configured = config.trainer.get("logger", None) or []
    configured = [configured] if isinstance(configured, str) else [str(x) for x in configured]
    return list(dict.fromkeys([*configured, "console", "file"]))


def _env(name: str, value: str) -> str:
    return f"++ray_kwargs.ray_init.runtime_env.env_vars.{name}={hydra_str(value)}"


def smoke_overrides(full: ValidatedConfig, paths: SmokePaths, phase: str = RESUME, rollout: str = "small") -> list[str]:
    """Hydra overrides, after the recipe's, that turn the validated recipe `full` into launch `phase` of its smoke run.

    Both launches: train_batch_size = ppo_mini_batch_size = `smoke_batch_size` (one optimizer step per step; the
    recipe's own with `rollout="full"`); `_val_smoke` held-out prompts, no validation before training; the recipe's
    loggers plus console and verl's file logger writing `paths.phase_log(phase)` (its variable set in the Ray runtime
    environment of every process); checkpoints in `paths.ckpts`; every selected mode acting at each step and every
    write of the reference weights checked (`rpg.modes.smoke_overrides`, `VERIFY_REFRESH_ENV`); schedule-free's
    checkpoint with the HF export (x). `SAVE`: step 1, a checkpoint, no validation. `RESUME`: resumes it
    (resume_mode=auto), step 2, validation after it, no checkpoint. Everything
    else (model, engines, ranks, memory settings, token budgets, dynamic sampling) is the recipe's.
    """
    config, out = full.config, []
    if rollout != "full":
        p = smoke_batch_size(config)
        out += [f"data.train_batch_size={p}", f"actor_rollout_ref.actor.ppo_mini_batch_size={p}"]
    out += [f"data.val_max_samples={_val_smoke(config)}", "trainer.val_before_train=False",
            f"trainer.logger=[{','.join(_loggers(config))}]",
            _env("VERL_FILE_LOGGER_PATH", str(paths.phase_log(phase))),
            f"trainer.default_local_dir={hydra_str(str(paths.ckpts))}"]
    forced, check = modes.smoke_overrides(full.rpg)
    out += forced + ([_env(VERIFY_REFRESH_ENV, "1")] if check else [])
    if uses_schedule_free(config):  # the checkpoint carries the HF export of the average x (rpg/schedule_free.py)
        contents = dict.fromkeys([*full.actor.checkpoint.save_contents, "hf_model"])
        out.append(f"actor_rollout_ref.actor.checkpoint.save_contents=[{','.join(contents)}]")
    return [*out, *(SAVE_LAUNCH if phase == SAVE else RESUME_LAUNCH)]


def prepare(full: ValidatedConfig, log_dir: os.PathLike | str = "outputs/smoke") -> SmokePaths:
    """The smoke folder of the validated recipe `full`, made ready for a run: the folder made (verl's file logger
    does not), a previous
    run's logs removed (a run that fails before its first step is never summarised from stale lines), and a previous
    smoke checkpoint (a folder carrying `MARKER`) removed; a checkpoint folder without the marker is refused, never
    deleted. The new checkpoint folder gets the marker."""
    paths = smoke_paths(full, log_dir)
    paths.root.mkdir(parents=True, exist_ok=True)
    for log in (paths.log, paths.step1_log):
        log.unlink(missing_ok=True)
    if paths.ckpts.exists():
        if not (paths.ckpts / MARKER).is_file():
            raise ValueError(f"{paths.ckpts} exists and is not a smoke checkpoint folder (no {MARKER}); the smoke run "
                             f"writes its checkpoint there: move it, or set RPG_SMOKE_DIR to another folder")
        shutil.rmtree(paths.ckpts)
    paths.ckpts.mkdir(parents=True)
    (paths.ckpts / MARKER).write_text("a SMOKE=1 checkpoint (rpg/smoke.py); the next smoke run replaces it\n")
    return paths


def checkpoint_line(paths: SmokePaths, run_ckpts: str) -> str:
    """After launch 1: the step-1 checkpoint under the smoke folder (raises if verl wrote none)."""
    step = paths.ckpts / "global_step_1"
    files = [f for f in step.rglob("*") if f.is_file()] if step.is_dir() else []
    if not files:
        raise RuntimeError(f"[rpg smoke] launch 1 finished without a checkpoint in {step}")
    size = sum(f.stat().st_size for f in files)
    return (f"[rpg smoke] checkpoint of step 1 saved under the smoke folder: {step} ({len(files)} files, "
            f"{size / GIB:.2f} GiB); the run's CKPTS_DIR ({run_ckpts}) is not touched\n")


def resume_line(paths: SmokePaths) -> str:
    """After launch 2: it resumed the step-1 checkpoint (its log holds step 2 only; raises otherwise)."""
    logged = read_log(paths.log) if paths.log.is_file() else {}
    steps = sorted(k for k, d in logged.items() if k > 0 and "timing_s/step" in d)
    if steps != [2]:
        raise RuntimeError(f"[rpg smoke] launch 2 logged training steps {steps}, expected [2]: it did not resume the "
                           f"step-1 checkpoint in {paths.ckpts}")
    return (f"[rpg smoke] resumed from {paths.ckpts / 'global_step_1'} in a second launch and finished step 2; the "
            "smoke checkpoint stays there until the next smoke run (delete it when done; the real run never reads "
            "it)\n")


class GpuMemorySampler:
    """Peak used memory of each local GPU, polled every `interval_s` by a thread of the launcher process.

    NVML (`pynvml` from nvidia-ml-py, a vLLM dependency) reports the memory used by all processes on a GPU: vLLM's
    pool (weights + KV cache, rollout.gpu_memory_utilization of the GPU) and the FSDP workers alike. Its peak is the
    rollout phase's: with rollout.free_cache_engine=True (verl's default) the synchronous trainer puts vLLM to sleep
    after generation, freeing its KV cache, before the log-prob and update phases, whose peak is the allocator peak
    verl logs (`actor/perf/max_memory_*`). Without NVML: `nvidia-smi`; without either (CPU) a no-op: no thread,
    `backend` None, `peaks` empty.
    """

    def __init__(self, interval_s: float = 0.5):
        self.interval_s, self.backend, self.peaks, self.totals = interval_s, None, {}, {}
        self._stop, self._thread, self._nvml, self._count = threading.Event(), None, None, 0

    def _read(self) -> dict[int, tuple[int, int]]:  # GPU index -> (used, total) bytes
        if self.backend == "nvml":
            nvml = self._nvml
            infos = [nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(self._count)]
            return {i: (m.used, m.total) for i, m in enumerate(infos)}
        query = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
        rows = [[int(x) for x in line.split(",")] for line in out.splitlines() if line.strip()]
        return {i: (used * 1024**2, total * 1024**2) for i, used, total in rows}

    def _loop(self) -> None:
        while True:
            try:
                for i, (used, total) in self._read().items():
                    self.peaks[i], self.totals[i] = max(self.peaks.get(i, 0), used), total
            except Exception:  # noqa: BLE001 -- a missed sample is not worth stopping the run for
                pass
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> "GpuMemorySampler":
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._count, self.backend = pynvml, pynvml.nvmlDeviceGetCount(), "nvml"
        except Exception:  # noqa: BLE001 -- no NVML library or no driver: nvidia-smi, else nothing to sample
            self.backend = "nvidia-smi" if shutil.which("nvidia-smi") else None
        try:
            if self.backend is not None:
                self._read()
                self._thread = threading.Thread(target=self._loop, name="rpg-smoke-gpu-memory", daemon=True)
                self._thread.start()
        except Exception:  # noqa: BLE001 -- e.g. nvidia-smi without a driver: no GPU to sample
            self.backend = None
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)


def _val_prompts(config) -> Optional[int]:
    """Prompts of one full validation (local parquet rows, capped by data.val_max_samples); None if not local."""
    import pyarrow.parquet as pq

    files = config.data.val_files
    files = [str(f) for f in ([files] if isinstance(files, str) else files)]
    if not all(f.endswith(".parquet") and os.path.isfile(f) for f in files):
        return None
    rows, cap = sum(pq.ParquetFile(f).metadata.num_rows for f in files), int(config.data.get("val_max_samples") or -1)
    return min(rows, cap) if cap > 0 else rows


def _validations(config, steps: int) -> int:
    """Validations of a run of `steps` steps: before training (if set), every test_freq steps and after the last."""
    tf = int(config.trainer.test_freq)
    periodic = sum(1 for k in range(1, steps + 1) if k % tf == 0 or k == steps) if tf > 0 else 0
    return int(bool(config.trainer.get("val_before_train", True))) + periodic


def _span(lo: float, hi: float, fmt=lambda x: f"{x:.1f} s") -> str:
    return fmt(lo) if math.isclose(lo, hi, rel_tol=1e-3) else f"{fmt(lo)} .. {fmt(hi)}"


@dataclasses.dataclass
class SmokeReport:
    """What a smoke run measured (verl's file log, the sampler) and what it projects for the full run."""

    steps: list[int]  # the training steps logged
    measured: list[int]  # the steps averaged: all but step 1 (warm-up) when there are >= 2
    seconds: dict[str, float]  # timing key (PHASES, "testing", "step") -> mean seconds
    update_gib: Optional[tuple[float, float]]  # actor workers' torch allocator peak: (allocated, reserved)
    gpu_peaks: dict[int, tuple[int, int]]  # sampler: GPU -> (peak used, total) bytes
    device: str
    full_steps: Optional[int]
    scale: float  # full train_batch_size / smoke train_batch_size
    val_prompts: tuple[int, Optional[int]]  # prompts per validation: (smoke, full)
    validations: int  # of the full run
    wall_s: Optional[float] = None  # the smoke run's wall time, if the caller timed it
    run_s: float = 0.0  # seconds of its steps and validation (wall_s - run_s: start-up and shutdown)
    host: dict[str, float] = dataclasses.field(default_factory=dict)  # GiB

    def format(self) -> str:
        s, left_out = self.seconds, " (step 1, the warm-up, left out)" if self.measured != self.steps else ""
        lines = [f"[rpg smoke] steps {self.steps}: seconds per step are the mean over steps {self.measured}{left_out}"]
        gpu = max((u for u, _ in self.gpu_peaks.values()), default=None)
        mem = {"gen": f"{gpu / GIB:.1f} GiB peak used on a GPU (NVML, all processes)" if gpu else "not measured"}
        if self.update_gib and self.device != "cpu":
            mem["update_actor"] = (f"{self.update_gib[0]:.1f} GiB allocated / {self.update_gib[1]:.1f} GiB reserved "
                                   "(torch peak of the actor workers, their log-prob passes included)")
        for label, key, _ in PHASES + (("validation", "testing", None), ("step (total)", "step", None)):
            if key in s:
                lines.append(f"  {label:<14} {s[key]:9.2f} s" + (f"   memory: {mem[key]}" if key in mem else ""))
        if self.device == "cpu":
            host = ", ".join(f"{k} {v:.2f} GiB" for k, v in self.host.items())
            lines.append(f"  memory: GPU memory is not measured on CPU; {host}")
        elif self.gpu_peaks:
            lines.append("  GPU peaks (used/total): " + ", ".join(
                f"GPU{i} {u / GIB:.1f}/{t / GIB:.1f} GiB" for i, (u, t) in sorted(self.gpu_peaks.items())))
        return "\n".join(lines + self.projection()) + "\n"

    def projection(self) -> list[str]:
        s, k, (v_smoke, v_full) = self.seconds, self.scale, self.val_prompts
        if self.full_steps is None:
            return ["  projected wall time: unknown (the recipe sets no trainer.total_training_steps)"]
        train = sum(s.get(key, 0.0) for _, key, scaled in PHASES if scaled)
        gen = s.get("gen", 0.0)
        rest = s["step"] - gen - train  # weight sync and the unattributed time: as measured
        step = (gen + k * train + rest, k * gen + k * train + rest)
        val_k = v_full / v_smoke if v_full else 1.0
        val = (s.get("testing", 0.0), s.get("testing", 0.0) * val_k)
        total = [self.full_steps * a + self.validations * b for a, b in zip(step, val)]
        hours = _span(*total, lambda x: f"{x:.0f} s" if x < 600 else f"{x / 3600:.2f} h")
        lines = [
            f"  projected wall time of the full run = steps × step seconds + validations × validation seconds = "
            f"{self.full_steps} × {_span(*step)} + {self.validations} × {_span(*val)} = {hours}",
            f"    step seconds at the full batch (×{k:g} the smoke batch): reward, old log-prob, reference, advantage "
            f"and update ×{k:g}; rollout from ×1 (one parallel decode) to ×{k:g} (linear); the rest as measured",
            f"    validation seconds for {v_full or '?'} prompts (smoke: {v_smoke}): from as measured to ×{val_k:g} "
            "(linear in prompts)",
        ]
        if self.wall_s is not None:
            lines.append(f"    not included: start-up and shutdown, {max(self.wall_s - self.run_s, 0.0):.0f} s of "
                         f"this run's {self.wall_s:.0f} s")
        return lines


def read_log(*jsonl_paths: os.PathLike | str) -> dict[int, dict[str, Any]]:
    """step -> metrics of verl's file logger (lines {"step": N, "data": {...}}; a step's lines merged), over the files
    that exist (a smoke run's two launches write one each)."""
    rows: dict[int, dict[str, Any]] = {}
    for path in (Path(p) for p in jsonl_paths):
        if not path.is_file() and len(jsonl_paths) > 1:
            continue
        for record in (json.loads(line) for line in path.read_text().splitlines() if line.strip()):
            rows.setdefault(int(record["step"]), {}).update(record["data"])
    return rows


def report(jsonl_path, full: ValidatedConfig, sampler: Optional[GpuMemorySampler] = None, wall_s=None,
           full_rollout: bool = False) -> SmokeReport:
    """`SmokeReport` of verl's file log `jsonl_path`; `full` is the validated recipe without the smoke overrides.

    Seconds per phase: the mean over the logged steps but step 1 (its warm-up) when there are >= 2; the validation
    (once, after step 2) counts whichever step it followed. Memory: the largest value over the steps."""
    rows, full_config = read_log(*(jsonl_path if isinstance(jsonl_path, (list, tuple)) else [jsonl_path])), full.config
    steps = sorted(k for k, d in rows.items() if k > 0 and "timing_s/step" in d)
    if not steps:
        raise ValueError(f"{jsonl_path}: no training step logged (no timing_s/step); the smoke run failed early")
    measured, seconds = steps[1:] if len(steps) >= 2 else steps, {}
    for key in {k[len("timing_s/") :] for st in steps for k in rows[st] if k.startswith("timing_s/")}:
        counted = steps if key == "testing" else measured
        got = [rows[st][f"timing_s/{key}"] for st in counted if f"timing_s/{key}" in rows[st]]
        if got:
            seconds[key] = sum(got) / len(got)

    alloc, reserved, used = (max((rows[st][m] for st in steps if m in rows[st]), default=None) for m in (
        "actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb", "actor/perf/cpu_memory_used_gb"))
    host = {"peak RSS of this (launcher) process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}
    host.update({"machine memory in use at the update": used} if used is not None else {})
    v_full, total = _val_prompts(full_config), full_config.trainer.total_training_steps
    scale = 1.0 if full_rollout else int(full_config.data.train_batch_size) / smoke_batch_size(full_config)
    return SmokeReport(
        steps=steps,
        measured=measured,
        seconds=seconds,
        update_gib=(alloc, reserved or 0.0) if alloc is not None else None,
        gpu_peaks={i: (u, sampler.totals[i]) for i, u in sampler.peaks.items()} if sampler else {},
        device=str(full_config.trainer.device),
        full_steps=int(total) if total else None,
        scale=scale,
        val_prompts=(min(_val_smoke(full_config), v_full or _val_smoke(full_config)), v_full),
        validations=_validations(full_config, int(total)) if total else 0,
        wall_s=wall_s,
        host=host,
        run_s=sum(rows[st]["timing_s/step"] + rows[st].get("timing_s/testing", 0.0) for st in steps),
    )


def summarize(jsonl_path, full: ValidatedConfig, sampler: Optional[GpuMemorySampler] = None, wall_s=None,
              full_rollout: bool = False) -> str:
    """The smoke report of the validated recipe `full` as text: per phase seconds per step and peak memory; the
    projected full-run wall time; the memory plan against the peaks; the rollout/trainer mismatch."""
    paths = jsonl_path if isinstance(jsonl_path, (list, tuple)) else [jsonl_path]
    rep = report(jsonl_path, full, sampler, wall_s, full_rollout)
    return rep.format() + smoke_comparison(full, rep) + report_lines(read_log(*paths))


def run_launches(args: list[str], full: ValidatedConfig, paths: SmokePaths, rollout: str = "small") -> None:
    """The smoke run: launch 1 (step 1 and its checkpoint) and launch 2 (resume, step 2, validation), each a new
    `python -m rpg.launch` process with `args` (the recipe's overrides) and `PHASE_ENV` set, as a user's run and its
    resume would be; the GPUs' memory sampled throughout; then the report. Raises RuntimeError when a launch fails."""
    need = estimate(full).one
    free = shutil.disk_usage(paths.root if paths.root.exists() else Path.cwd()).free
    if free < need:
        raise RuntimeError(f"the smoke folder {paths.root} (RPG_SMOKE_DIR) has {free / GB:.1f} GB free; the smoke "
                           f"checkpoint needs about {need / GB:.1f} GB: set RPG_SMOKE_DIR to a disk with more room")
    paths = prepare(full, paths.root)
    batch = "the recipe's" if rollout == "full" else smoke_batch_size(full.config)
    print(f"[rpg] smoke run (SMOKE=1): {SMOKE_STEPS} steps of {batch} prompts in two launches (step 1 and a checkpoint "
          f"in {paths.ckpts}; then a resume of it, step 2 and a validation), metrics to {paths.log}", flush=True)
    sampler, start = GpuMemorySampler().start(), time.monotonic()
    try:
        for phase in (SAVE, RESUME):
            launch = [sys.executable, "-m", "rpg.launch", *args]
            rc = subprocess.run(launch, env={**os.environ, PHASE_ENV: phase}).returncode
            if rc != 0:
                raise RuntimeError(f"smoke run: launch {1 if phase == SAVE else 2} of 2 ({phase}) exited with {rc}")
            run_ckpts = str(full.config.trainer.default_local_dir)
            sys.stdout.write(checkpoint_line(paths, run_ckpts) if phase == SAVE else resume_line(paths))
            sys.stdout.flush()
    finally:
        sampler.stop()
    elapsed = time.monotonic() - start
    sys.stdout.write(summarize([paths.step1_log, paths.log], full, sampler, elapsed, rollout == "full"))
    sys.stdout.flush()
