"""Compact progress for a CPU run: ``verl console output | python -m rpg.cpu.progress LOG [--steps N]``.

verl's console output on CPU is dominated by Ray/TransferQueue warnings; each training step is one very long
``step:N - key:value - ...`` line (``verl.utils.logger.LocalLogger``). This filter copies everything to LOG and prints
one short line per step (training accuracy, validation accuracy when there was a validation, the KL to the reference,
seconds per step and the time left), plus any line that looks like an error, so a person can watch a demo run.
Training accuracy is ``(critic/score/mean + 1) / 2`` for the ±1 math_dapo score; the KL is the RPG losses' estimate
``actor/rpg/kl`` (verl's ``actor/kl_loss`` for its own losses); the time left is the mean ``timing_s/step`` times the
steps left (docs/cpu.md#progress).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import IO, Optional

STEP_RE = re.compile(r"step:(\d+) - (.*)$")
PAIR_RE = re.compile(r"([\w@/\-.]+):(?:np\.\w+\()?(-?[\d.eE+-]+|nan|inf)\)?(?: - |$)")
VAL_RE = re.compile(r"^val-core/.+/acc/mean@\d+$")
ERROR_RE = re.compile(r"Traceback|Error|error:|Exception")
NOISE_RE = re.compile(r"target_num_threads|UserWarning|warnings\.warn|DeprecationWarning")
KL_METRICS = ("actor/rpg/kl", "actor/kl_loss")  # the RPG losses' KL estimate, else verl's KL loss


def parse_step(line: str) -> Optional[tuple[int, dict[str, float]]]:
    """``(step, metrics)`` from a LocalLogger line, or None."""
    match = STEP_RE.search(line)
    if not match:
        return None
    metrics = {}
    for key, value in PAIR_RE.findall(match.group(2)):
        try:
            metrics[key] = float(value)
        except ValueError:
            continue
    return int(match.group(1)), metrics


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def summary(step: int, metrics: dict[str, float], total: Optional[int], eta_s: Optional[float] = None) -> str:
    parts = [f"step {step}" + (f"/{total}" if total else "")]
    if "critic/score/mean" in metrics:
        parts.append(f"train acc {(metrics['critic/score/mean'] + 1) / 2:6.1%}")
    for key, value in metrics.items():
        if VAL_RE.match(key):
            parts.append(f"VALIDATION acc {value:6.1%} ({key})")
    if kl := next((key for key in KL_METRICS if key in metrics), None):
        parts.append(f"KL {metrics[kl]:.2e}")
    if "timing_s/step" in metrics:
        parts.append(f"{metrics['timing_s/step']:.1f} s/step")
    if eta_s is not None:
        parts.append(f"ETA {_duration(eta_s)}")
    return "[progress] " + " | ".join(parts)


def follow(stream: IO[str], log: IO[str], out: IO[str], total: Optional[int]) -> None:
    seconds: list[float] = []  # timing_s/step of the training steps so far
    for line in stream:
        log.write(line)
        parsed = parse_step(line)
        if parsed is not None:
            step, metrics = parsed
            if "timing_s/step" in metrics:
                seconds.append(metrics["timing_s/step"])
            eta = sum(seconds) / len(seconds) * max(total - step, 0) if total and seconds else None
            out.write(summary(step, metrics, total, eta) + "\n")
        elif ERROR_RE.search(line) and not NOISE_RE.search(line):
            out.write(line)
        out.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="file that receives the full console output")
    ap.add_argument("--steps", type=int, default=None, help="total training steps (for 'step k/N')")
    args = ap.parse_args(argv)
    with open(args.log, "w") as log:
        follow(sys.stdin, log, sys.stdout, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
