"""Run a CPU recipe (recipe/rpg/cpu/run_*.sh: the launcher + verl's real trainer) from a test (shared helper).

Used by the end-to-end tests of the trainer, the periodic reference and schedule-free AdamW.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from rpg.shards import local_shard

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipe" / "rpg" / "cpu"
TINY = ROOT / "artifacts" / "tiny"
# knobs a developer may have exported that must not leak into a test run
_DROP = ("RAY_ADDRESS", "RPG_DRY_RUN", "RPG_PRINT_ARGV", "VERL_USE_EXTERNAL_MODULES", "CPU_ROLLOUT", "CPU_DTYPE", "SMOKE",
         "RPG_SMOKE_DIR", "SMOKE_ROLLOUT", "RPG_SMOKE_PHASE", "OLD_LOGPROB", "TRAINER_MODE")
# A launch's limit: it catches a hang, not a slow machine. Alone a launch takes 2-4 minutes on 2 cores; beside another
# start-up it takes 2-4 times as long (a vLLM launch beside the vLLM async run: over 600 s in CI, docs/testing.md).
TRAINER_TIMEOUT_S = 1200


def ensure_tiny_model() -> Path:
    """artifacts/tiny, built (idempotently, ~1 min the first time) by rpg.tools.tiny_model."""
    subprocess.run([sys.executable, "-m", "rpg.tools.tiny_model", "--out", str(TINY)], check=True, timeout=900)
    return TINY


def start_cpu_recipe(tmp: Path, name: str, overrides: list[str], script: str = "run_rpg_reinforce_urkl.sh",
                     timeout_s: int = TRAINER_TIMEOUT_S, **env: str | None) -> tuple[int | str, str]:  # fmt: skip
    """Run `recipe/rpg/cpu/<script>` in its own process group; return (exit code or "timeout", console text).

    `env` sets the CPU profile knobs (CPU_STEPS, CPU_BATCH, ...); a value None removes the variable (e.g.
    PYTHON=None for the launcher's own default). The metrics go to <tmp>/<name>.jsonl, the console to
    <tmp>/<name>.console.log.
    """
    console = tmp / f"{name}.console.log"
    full_env = {k: v for k, v in os.environ.items() if k not in _DROP}
    full_env.update({"CKPTS_DIR": str(tmp / "ckpts"), "EXP_NAME": name, "PYTHON": sys.executable,
                     "VERL_FILE_LOGGER_PATH": str(tmp / f"{name}.jsonl"), **env})  # fmt: skip
    full_env = {k: v for k, v in full_env.items() if v is not None}
    with open(console, "w") as out:
        proc = subprocess.Popen(["bash", str(RECIPES / script), *overrides], cwd=ROOT, env=full_env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # main_ppo tears Ray down on SIGINT
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            rc = "timeout"
    return rc, console.read_text(errors="replace")


def run_cpu_recipe(tmp: Path, name: str, overrides: list[str], script: str = "run_rpg_reinforce_urkl.sh",
                   timeout_s: int = TRAINER_TIMEOUT_S, **env: str | None) -> tuple[list[dict], str]:  # fmt: skip
    """`start_cpu_recipe`, then require exit 0 and a metrics file; return (file-logger records, console text).

    Fails with the console tail if the trainer does not exit 0 in time.
    """
    rc, text = start_cpu_recipe(tmp, name, overrides, script, timeout_s, **env)
    log_path, console = tmp / f"{name}.jsonl", tmp / f"{name}.console.log"
    tail = "\n".join(text.splitlines()[-60:])
    ended = f"did not finish within {timeout_s} s" if rc == "timeout" else f"exited with {rc}"
    assert rc == 0, f"{name}: trainer {ended}; last lines of {console}:\n{tail}"
    assert log_path.is_file(), f"{name}: no metrics file {log_path}\n{tail}"
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()], text


def finite(value) -> bool:
    """A logged metric that is a finite number (a missing metric, None, is not)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def training_steps(records: list[dict]) -> dict[int, dict]:
    """step -> metrics of the training steps (records that carry actor/pg_loss)."""
    return {r["step"]: r["data"] for r in records if "actor/pg_loss" in r["data"]}


def check_steps(records: list[dict], console: str, steps: list[int]) -> dict[int, dict]:
    """The run logged exactly `steps`: one JSON line each in the metrics file, one `step:N - ...` console line each
    (verl's console logger, the line `rpg.cpu.progress` turns into a progress line), and every RPG metric
    (`actor/rpg/*`) and `actor/pg_loss` finite. Returns step -> metrics."""
    from rpg.cpu.progress import parse_step

    train = training_steps(records)
    logged = sorted(r["step"] for r in records if "actor/pg_loss" in r["data"])
    assert logged == steps, f"metrics file: training steps {logged}, expected {steps}"
    printed = sorted(p[0] for p in map(parse_step, console.splitlines()) if p is not None and p[0] > 0)
    assert printed == steps, f"console: step lines {printed}, expected one per step {steps}"
    for step, data in train.items():
        rpg = {k: v for k, v in data.items() if k.startswith("actor/rpg/")}
        assert rpg, f"step {step}: no actor/rpg/* metrics"
        bad = {k: v for k, v in {**rpg, "actor/pg_loss": data["actor/pg_loss"]}.items() if not finite(v)}
        assert not bad, f"step {step}: non-finite metrics {bad}"
    return train


# ---- schedule-free checkpoints (tests/e2e, tests/ranks) -----------------------------------------------------------
def assert_hf_export_is_x(ckpt, world_size: int, distinct: bool = True) -> None:
    """The checkpoint holds y and a train-mode optimizer, and its `huggingface/` export is the average x = lerp(y, z,
    1 - 1/β1) (schedulefree's eval()), bit for bit, reassembled from the ranks' FSDP2 shards (dim 0); with `distinct`
    (k ≥ 2 optimizer steps), x ≠ y somewhere (else the export could not be told from the training iterate; after a
    single step schedule-free's x, y and z coincide)."""
    import torch
    from safetensors.torch import load_file

    models = [torch.load(ckpt / f"model_world_size_{world_size}_rank_{r}.pt", weights_only=False)
              for r in range(world_size)]  # fmt: skip
    optims = [torch.load(ckpt / f"optim_world_size_{world_size}_rank_{r}.pt", weights_only=False)
              for r in range(world_size)]  # fmt: skip
    beta1 = optims[0]["param_groups"][0]["betas"][0]
    # optimizer state is indexed in parameter order = state_dict order without the (last, tied) lm_head
    names = [n for n in models[0] if not n.endswith("lm_head.weight")]
    hf = load_file(ckpt / "huggingface" / "model.safetensors")
    differs, compared = False, 0
    for i, name in enumerate(names):
        states = [o["state"].get(i) for o in optims]
        if any(s is None for s in states) or name not in hf:
            continue
        y = torch.cat([local_shard(m[name]) for m in models])
        z = torch.cat([local_shard(s["z"]) for s in states])
        x = torch.lerp(y, z, 1 - 1 / beta1)
        torch.testing.assert_close(hf[name].float(), x.to(hf[name].dtype).float(), rtol=0, atol=0)
        differs |= not torch.equal(x.to(hf[name].dtype), y.to(hf[name].dtype))
        compared += 1
    assert compared >= len(names) - 1, (compared, len(names))
    assert differs or not distinct, "x == y everywhere: the HF export cannot be distinguished from the training iterate"
