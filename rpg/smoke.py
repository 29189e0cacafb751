"""Smoke mode (`SMOKE=1 bash recipe/rpg/<dir>/run_*.sh`): the recipe as it is, for 2 steps, then a report.

A smoke run keeps everything that can fail on a real cluster (model, engines, ranks, memory settings, per-GPU token
budgets) and shrinks only what costs time: 2 training steps on the smallest batch that fills every rank's
micro-batches, one short validation at the end, no checkpoint, metrics to verl's file logger. It then prints, per
phase, the seconds per step and the measured peak memory, and the projected wall time of the full run: minutes to
find an install, engine or memory fault instead of a GPU-day.

* `smoke_overrides(config, log_path)`: the Hydra overrides that turn a composed recipe config into its smoke run;
  `prepare(config)` also makes the log's folder and returns (overrides, log path).
* `GpuMemorySampler`: a thread polling each local GPU's used memory (NVML, else `nvidia-smi`) every 0.5 s; the peak.
* `summarize(jsonl_path, full_config, sampler, wall_s)`: the report (`SmokeReport.format()`).
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
from pathlib import Path
from typing import Any, Optional

SMOKE_ENV = "SMOKE"
SMOKE_STEPS = 2
SMOKE_TEST_FREQ = 2  # validate once, after step 2 (verl also validates on the last step whenever test_freq > 0)
GIB = 1024**3
# (label, timing key, scaled with the batch): verl's v1 trainer times these sections of a step (timing_s/<key>)
PHASES = (
    ("rollout (gen)", "gen", None),  # None: between ×1 (one parallel decode) and ×scale (linear)
    ("reward", "reward", True),
    ("old log-prob", "old_log_prob", True),
    ("reference", "ref", True),
    ("advantage", "adv", True),
    ("update", "update_actor", True),
    ("weight sync", "update_weights", False),
)


def smoke_requested(environ=os.environ) -> bool:
    value = environ.get(SMOKE_ENV, "").strip().lower()
    if value not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(f"{SMOKE_ENV}={environ[SMOKE_ENV]!r} is not valid; use 1 (smoke run) or 0")
    return value in ("1", "true", "yes", "on")


def _world(config) -> int:
    return int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)


def smoke_batch_size(config) -> int:
    """The fewest prompts P such that P × rollout.n sequences fill every data-parallel rank's micro-batches.

    dp = world / ulysses_sequence_parallel_size. Each rank needs `fill` sequences: the micro-batch size per GPU with
    a static batch (the largest of actor, rollout log-prob and reference), or, with dynamic batches, the sequences of
    maximal length (max_prompt_length + max_response_length) that fill the largest per-GPU token budget. verl needs
    P × n divisible by the world size, and (static batch) each rank's share divisible by the actor's micro-batch.
    """
    arr, world = config.actor_rollout_ref, _world(config)
    n, dp = int(arr.rollout.n), world // int(arr.actor.get("ulysses_sequence_parallel_size", 1) or 1)
    micro = int(arr.actor.ppo_micro_batch_size_per_gpu or 1)
    if arr.actor.use_dynamic_bsz:
        seq = int(config.data.max_prompt_length) + int(config.data.max_response_length)
        budgets = (arr.actor.ppo_max_token_len_per_gpu, arr.rollout.log_prob_max_token_len_per_gpu,
                   arr.ref.log_prob_max_token_len_per_gpu)  # fmt: skip
        fill, multiple = max(math.ceil(int(b) / seq) for b in budgets if b), 1
    else:
        sizes = (micro, arr.rollout.log_prob_micro_batch_size_per_gpu, arr.ref.log_prob_micro_batch_size_per_gpu)
        fill, multiple = max(int(s) for s in sizes if s), micro
    p = 1
    while (p * n) % world or (p * n) // dp < fill or ((p * n) // dp) % multiple:
        p += 1
    return p


def _hydra_str(s: str) -> str:
    """`s` as a single-quoted Hydra value that composes to exactly `s` (as common.sh's _rpg_hydra_str)."""
    out, bs = [], ""
    for i, c in enumerate(s):
        if c == "\\":
            bs += c
            continue
        if c == "'":
            out.append(bs * 2 + "\\'")
        elif c == "$" and s[i + 1 : i + 2] == "{":
            out.append(bs * 2 + "\\$")
        else:
            out.append(bs + c)
        bs = ""
    return "'" + "".join(out) + bs * 2 + "'"


def smoke_overrides(config, log_path: os.PathLike | str) -> list[str]:
    """Hydra overrides (appended after the recipe's) that turn the composed recipe `config` into its smoke run.

    Changed: 2 steps; train_batch_size = ppo_mini_batch_size = `smoke_batch_size` (one optimizer step per step);
    validation of max(8, world) held-out prompts once, after step 2 (none before training: the validation then runs
    on warm engines, as in the full run's periodic validations); no checkpoint saves and no resume (a full run's
    checkpoints are neither read nor written); logger console + verl's file logger at `log_path` (passed to every
    Ray process in the runtime environment; wandb is left out so a smoke run makes no experiment). Everything else
    (model, engines, ranks, memory settings, token budgets, dynamic sampling) is the recipe's.
    """
    p = smoke_batch_size(config)
    return [
        f"trainer.total_training_steps={SMOKE_STEPS}",
        f"data.train_batch_size={p}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={p}",
        f"data.val_max_samples={max(8, _world(config))}",
        "trainer.val_before_train=False",
        f"trainer.test_freq={SMOKE_TEST_FREQ}",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[console,file]",
        f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={_hydra_str(str(log_path))}",
    ]


def prepare(config, log_dir: os.PathLike | str = "outputs/smoke") -> tuple[list[str], Path]:
    """(overrides, log path) of the smoke run of `config`; makes the folder and removes a previous run's log (so a
    run that fails before its first step is never summarised from stale lines). verl's file logger needs the folder."""
    path = Path(log_dir).resolve() / f"{config.trainer.experiment_name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    return smoke_overrides(config, path), path


# --------------------------------------------------------------------------------------------------------------
# GPU memory sampler
# --------------------------------------------------------------------------------------------------------------
class GpuMemorySampler:
    """Peak used memory of each local GPU, polled every `interval_s` from the launcher process.

    NVML (`pynvml`, from nvidia-ml-py, which vLLM depends on) reports the memory used by all processes on a GPU:
    vLLM's pool (weights + KV cache, gpu_memory_utilization of the GPU) and the FSDP workers alike. Its peak is the
    rollout phase's: with rollout.free_cache_engine=True (verl's default) the synchronous trainer puts vLLM to sleep
    after generation (KV cache freed) before the log-prob and update phases, whose own peak is the allocator peak
    verl logs (`actor/perf/max_memory_*`). Without NVML it falls back to `nvidia-smi`; without either (CPU) it is a
    no-op: no thread, `available` False, `peaks` empty.
    """

    def __init__(self, interval_s: float = 0.5):
        self.interval_s, self.backend, self.peaks, self.totals = interval_s, None, {}, {}
        self._stop, self._thread, self._nvml = threading.Event(), None, None

    @property
    def available(self) -> bool:
        return self.backend is not None

    def _read(self) -> dict[int, tuple[int, int]]:
        """GPU index -> (used, total) bytes."""
        if self.backend == "nvml":
            nvml = self._nvml
            infos = [nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(self._count)]
            return {i: (m.used, m.total) for i, m in enumerate(infos)}
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,"
                              "nounits"], capture_output=True, text=True, timeout=10, check=True).stdout  # fmt: skip
        rows = [[int(x) for x in line.split(",")] for line in out.splitlines() if line.strip()]
        return {i: (used * 1024**2, total * 1024**2) for i, used, total in rows}

    def start(self) -> "GpuMemorySampler":
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._count, self.backend = pynvml, pynvml.nvmlDeviceGetCount(), "nvml"
        except Exception:  # noqa: BLE001 -- no NVML library or no driver: try nvidia-smi, else nothing to sample
            self.backend = "nvidia-smi" if shutil.which("nvidia-smi") else None
        if self.backend is not None:
            try:
                self._sample()
            except Exception:  # noqa: BLE001 -- a driver-less nvidia-smi: no GPU to sample
                self.backend = None
        if self.backend is not None:
            self._thread = threading.Thread(target=self._loop, name="rpg-smoke-gpu-memory", daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        for i, (used, total) in self._read().items():
            self.peaks[i], self.totals[i] = max(self.peaks.get(i, 0), used), total

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception:  # noqa: BLE001 -- a missed sample is not worth stopping the run for
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._sample()

    def __enter__(self) -> "GpuMemorySampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------------
def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _val_prompts(config) -> Optional[int]:
    """Prompts of one full validation: rows of the local validation files (parquet metadata), capped by
    data.val_max_samples; None when a file is not local parquet."""
    import pyarrow.parquet as pq

    files = config.data.val_files
    rows = 0
    for f in [files] if isinstance(files, str) else list(files):
        if not (str(f).endswith(".parquet") and os.path.isfile(str(f))):
            return None
        rows += pq.ParquetFile(str(f)).metadata.num_rows
    cap = int(config.data.get("val_max_samples", -1) or -1)
    return min(rows, cap) if cap > 0 else rows


def _validations(config, steps: int) -> int:
    tf = int(config.trainer.test_freq)
    periodic = sum(1 for k in range(1, steps + 1) if k % tf == 0 or k == steps) if tf > 0 else 0
    return int(bool(config.trainer.get("val_before_train", True))) + periodic


def _span(lo: float, hi: float, fmt) -> str:
    return fmt(lo) if math.isclose(lo, hi, rel_tol=1e-3) else f"{fmt(lo)} .. {fmt(hi)}"


def _hours(s: float) -> str:
    return f"{s:.0f} s" if s < 600 else f"{s / 3600:.2f} h"


@dataclasses.dataclass
class SmokeReport:
    """What a smoke run measured (from verl's file logger) and what it projects for the full run."""

    steps: list[int]  # the training steps logged
    measured: list[int]  # the steps averaged: all but step 1 when there are >= 2 (step 1 is warm-up)
    seconds: dict[str, float]  # timing key -> mean seconds per step; "step" the whole step; "testing" validation
    update_gib: Optional[tuple[float, float]]  # torch allocator peak (allocated, reserved) of the actor workers
    gpu_peaks: dict[int, tuple[int, int]]  # sampler: GPU -> (peak used, total) bytes
    device: str
    full_steps: Optional[int]
    scale: float  # full train_batch_size / smoke train_batch_size
    val_prompts: tuple[int, Optional[int]]  # (smoke, full) prompts per validation
    validations: int
    wall_s: Optional[float] = None
    run_s: float = 0.0  # seconds of all logged steps and validations (the rest of wall_s is start-up and shutdown)
    host: dict[str, float] = dataclasses.field(default_factory=dict)

    def format(self) -> str:
        s, lines = self.seconds, [f"[rpg smoke] steps {self.steps}; seconds are the mean over steps {self.measured}"
                                  f"{' (step 1, the warm-up, left out)' if self.measured != self.steps else ''}"]  # fmt: skip
        gpu = max((u for u, _ in self.gpu_peaks.values()), default=None)
        mem = {"gen": f"{gpu / GIB:.1f} GiB peak used (GPU, all processes)" if gpu is not None else "not measured"}
        if self.update_gib and self.device != "cpu":
            mem["update_actor"] = f"{self.update_gib[0]:.1f} GiB allocated / {self.update_gib[1]:.1f} GiB reserved"
        for label, key, _ in PHASES + (("validation", "testing", None), ("step (total)", "step", None)):
            if key in s:
                lines.append(f"  {label:<14} {s[key]:9.2f} s" + (f"   memory: {mem[key]}" if key in mem else ""))
        if self.device == "cpu":
            lines.append("  memory: GPU memory is not measured on CPU; " + ", ".join(f"{k} {v:.2f} GiB"
                                                                                    for k, v in self.host.items()))
        elif gpu is not None:
            lines.append("  rollout memory = NVML peak over the run per GPU: " + ", ".join(
                f"GPU{i} {u / GIB:.1f}/{t / GIB:.1f} GiB" for i, (u, t) in sorted(self.gpu_peaks.items())))
        lines += self.projection()
        return "\n".join(lines) + "\n"

    def projection(self) -> list[str]:
        s, k, (v_smoke, v_full) = self.seconds, self.scale, self.val_prompts
        if self.full_steps is None or "step" not in s:
            return ["  projected wall time: unknown (no trainer.total_training_steps or no step logged)"]
        train = sum(s.get(key, 0.0) for _, key, scaled in PHASES if scaled)
        gen, rest = s.get("gen", 0.0), s["step"] - sum(s.get(key, 0.0) for _, key, _ in PHASES)
        step = (gen + k * train + rest, k * gen + k * train + rest)
        val_k = v_full / v_smoke if v_full and v_smoke else 1.0
        val = (s.get("testing", 0.0), s.get("testing", 0.0) * val_k)
        total = [self.full_steps * a + self.validations * b for a, b in zip(step, val)]
        lines = [
            f"  projected wall time of the full run = steps × step seconds + validations × validation seconds"
            f" = {self.full_steps} × {_span(*step, lambda x: f'{x:.1f}')} s + {self.validations} × "
            f"{_span(*val, lambda x: f'{x:.1f}')} s = {_span(*total, _hours)}",
            f"    step seconds at the full batch (×{k:g} the smoke batch): old log-prob, reference, advantage, reward"
            f" and update ×{k:g}; rollout from ×1 (one parallel decode) to ×{k:g} (linear); the rest as measured",
            f"    validation seconds for {v_full if v_full else '?'} prompts (smoke: {v_smoke}): from as measured to "
            f"×{val_k:g} (linear in prompts)",
        ]
        if self.wall_s is not None:
            startup = self.wall_s - self.run_s
            lines.append(f"    not included: start-up and shutdown, about {max(startup, 0.0):.0f} s in this run "
                         f"(wall {self.wall_s:.0f} s)")  # fmt: skip
        return lines


def read_log(jsonl_path: os.PathLike | str) -> dict[int, dict[str, Any]]:
    """step -> metrics of verl's file logger (lines of {"step": N, "data": {...}}; a step's lines merged)."""
    rows: dict[int, dict[str, Any]] = {}
    for line in Path(jsonl_path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            rows.setdefault(int(record["step"]), {}).update(record["data"])
    return rows


def report(jsonl_path, full_config, sampler: Optional[GpuMemorySampler] = None, wall_s=None) -> SmokeReport:
    rows = read_log(jsonl_path)
    steps = sorted(k for k, d in rows.items() if k > 0 and "timing_s/step" in d)
    if not steps:
        raise ValueError(f"{jsonl_path}: no training step logged (no timing_s/step); the smoke run failed early")
    measured = steps[1:] if len(steps) >= 2 else steps
    keys = {k[len("timing_s/"):] for st in steps for k in rows[st] if k.startswith("timing_s/")}
    seconds = {key: _mean([rows[st][f"timing_s/{key}"] for st in measured if f"timing_s/{key}" in rows[st]]) for key in keys}
    seconds = {k: v for k, v in seconds.items() if v is not None}
    if "testing" not in seconds:  # validation ran once (step 2): its own time, warm-up or not
        tests = [rows[st]["timing_s/testing"] for st in steps if "timing_s/testing" in rows[st]]
        seconds.update({"testing": _mean(tests)} if tests else {})
    upd = [(rows[st].get("actor/perf/max_memory_allocated_gb"), rows[st].get("actor/perf/max_memory_reserved_gb"))
           for st in steps]  # fmt: skip
    upd = [u for u in upd if u[0] is not None]
    cfg_device = str(full_config.trainer.get("device", "cuda"))
    host = {"peak RSS of this process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}
    used = [rows[st]["actor/perf/cpu_memory_used_gb"] for st in steps if "actor/perf/cpu_memory_used_gb" in rows[st]]
    if used:
        host["machine memory in use at the update (max)"] = max(used)
    smoke_p, v_full = smoke_batch_size(full_config), _val_prompts(full_config)
    v_smoke = max(8, _world(full_config)) if v_full is None else min(max(8, _world(full_config)), v_full)
    total = full_config.trainer.get("total_training_steps", None)
    run_s = sum(rows[st]["timing_s/step"] + rows[st].get("timing_s/testing", 0.0) for st in steps)
    return SmokeReport(
        steps=steps, measured=measured, seconds=seconds,
        update_gib=(max(u[0] for u in upd), max(u[1] or 0.0 for u in upd)) if upd else None,
        gpu_peaks={i: (u, sampler.totals[i]) for i, u in sampler.peaks.items()} if sampler else {},
        device=cfg_device, full_steps=int(total) if total else None,
        scale=int(full_config.data.train_batch_size) / smoke_p,
        val_prompts=(v_smoke, v_full), validations=_validations(full_config, int(total)) if total else 0,
        wall_s=wall_s, run_s=run_s, host=host,
    )  # fmt: skip


def summarize(jsonl_path, full_config, sampler: Optional[GpuMemorySampler] = None, wall_s=None) -> str:
    """The smoke report of verl's file log `jsonl_path` for the recipe `full_config` (the config before the smoke
    overrides): per phase the seconds per step and peak memory, and the projected wall time of the full run."""
    return report(jsonl_path, full_config, sampler, wall_s).format()


if __name__ == "__main__":  # python -m rpg.smoke LOG.jsonl -- <recipe overrides>: summarise a finished smoke run
    from rpg.launch import compose_config

    print(summarize(sys.argv[1], compose_config(sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:])))
