"""The guard of the laptop demo's numbers (README "Laptop demo", docs/cpu.md#demo-results): the CPU e2e run's first
steps, reduced to a few numbers, compared with the values recorded for the tiny model they came from.

The demo and the e2e run share everything that decides their numbers but their sizes: verl's trainer, the CPU
profile, the `hf` rollout and its per-request seeds, the tiny model. A change that moves the demo (threads, a
reduction order, a seed, a package version, the rollout's sampling) moves these numbers too. They depend on the tiny
model, which each machine builds itself (`rpg.tools.tiny_model`), and its build depends on the processor (an AVX2
build differs from an AVX-512 one: docs/cpu.md#demo-results), so they are recorded per build: the SHA-256 of its
`model.safetensors`. On a build with no record the guard says so and is skipped (it cannot tell a moved demo from
another processor); `RPG_RECORD_DEMO_GUARD=1` records the build's numbers (written atomically, kept sorted).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Iterable

from rpg.atomic import atomic_write_text

RECORD = Path(__file__).with_name("demo_guard.json")
RECORD_ENV = "RPG_RECORD_DEMO_GUARD"
#: (step, metric): validation accuracy before training, then the first two training steps' reward, loss and KL
KEYS = (
    (0, "val-core/math_dapo/acc/mean@2"),
    (1, "critic/score/mean"),
    (1, "actor/pg_loss"),
    (1, "actor/rpg/kl"),
    (2, "critic/score/mean"),
    (2, "actor/pg_loss"),
    (2, "actor/rpg/kl"),
)
MOVED = (
    "the demo's numbers moved: re-measure README (Laptop demo) and docs/cpu.md#demo-results with "
    "`bash scripts/demo_cpu.sh`, then record these values with RPG_RECORD_DEMO_GUARD=1 in the same commit"
)


def build_id(tiny_dir: Path) -> str:
    """The tiny model's identity: SHA-256 of its weights file (the first 16 hex digits)."""
    return hashlib.sha256((Path(tiny_dir) / "model" / "model.safetensors").read_bytes()).hexdigest()[:16]


def first_steps(records: Iterable[dict]) -> dict[str, float]:
    """The `KEYS` of a run's metric records (verl's file logger: {"step", "data"}), as "step:metric" -> value."""
    found = {}
    for record in records:
        for step, key in KEYS:
            if record["step"] == step and key in record["data"]:
                found[f"{step}:{key}"] = float(record["data"][key])
    missing = [f"{s}:{k}" for s, k in KEYS if f"{s}:{k}" not in found]
    assert not missing, f"the e2e run logged none of {missing}"
    return found


def recorded() -> dict[str, dict[str, float]]:
    return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def record(build: str, values: dict[str, float]) -> None:
    """Write `values` as the record of `build` (atomically; other builds' records kept)."""
    builds = {**recorded(), build: values}
    atomic_write_text(RECORD, json.dumps(dict(sorted(builds.items())), indent=1, sort_keys=True) + "\n")


def moved(expected: dict[str, float], got: dict[str, float], rel: float = 1e-9) -> list[str]:
    """The entries of `got` that differ from `expected` (beyond float printing), one line each."""
    return [f"{key}: recorded {want!r}, now {got.get(key)!r}" for key, want in expected.items()
            if key not in got or not math.isclose(got[key], want, rel_tol=rel, abs_tol=1e-12)]


def wants_recording(environ=os.environ) -> bool:
    return environ.get(RECORD_ENV, "") == "1"
