"""benchmarks/gpu_memory_probe.py's tiny CPU mode runs (FSDP2 on a one-rank gloo group, AdamW, checkpointing) and
prints a prediction, so the GPU probe does not rot between GPU sessions."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_probe_tiny_cpu_mode_runs():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_memory_probe.py"), "--device", "cpu",
                           "--tiny", "--layers", "1", "2"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[probe] tiny")]
    assert len(lines) == 2 and all("measured peak n/a (CPU), predicted" in ln for ln in lines), proc.stdout
