"""benchmarks/gpu_memory_probe.py's tiny CPU mode runs (FSDP2 on a one-rank gloo group, AdamW, checkpointing), each
layer count in a fresh process (one process for several keeps the previous model alive: issue 33's inflated slope),
and prints a plan and a verdict, so the GPU probe does not rot between GPU sessions."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_probe_tiny_cpu_mode_runs_each_layer_count_in_a_fresh_process():
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "gpu_memory_probe.py"), "--device", "cpu",
                             "--tiny", "--layers", "1", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)  # fmt: skip
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("[probe] tiny")]
    assert len(lines) == 2 and all("measured peak n/a (CPU), planned" in ln for ln in lines), out
    pids = {int(re.search(r"process (\d+)\)", ln).group(1)) for ln in lines}
    assert len(pids) == 2 and proc.pid not in pids, f"each layer count needs its own process: {lines}"
    assert "[probe] verdict: OK (nothing measured on CPU)" in out, out
