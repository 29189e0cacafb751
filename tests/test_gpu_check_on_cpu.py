"""scripts/gpu_check.sh's parts run on CPU, so the GPU check does not rot between the sessions that have a GPU
(docs/gpu.md#gpu-check): the loss check's small CPU mode passes under an interpreter without verl (the GPU machine
has none), and the top-k benchmark's stand-in for verl's log-prob path (used where verl is absent) equals verl's
`logprobs_from_logits` on the same logits."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
NO_VERL = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("verl", "omegaconf", "hydra", "ray", "tensordict", "vllm"):
            raise ImportError("not on the GPU check machine: " + name)
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_loss_check_passes_on_cpu_without_verl():
    proc = subprocess.run([sys.executable, "-c", NO_VERL, str(REPO / "benchmarks" / "gpu_loss_check.py"), "--device",
                           "cpu", "--small"], capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[loss check] PASS: 17 losses" in proc.stdout
    rows = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith(("rpg_", "grpo_"))]
    rows = [r for r in rows if "True" in r]  # the check's table, not the timing lines
    assert sum("fp32" in r for r in rows) == sum("bf16" in r for r in rows) >= 49, proc.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_bench_stand_in_equals_verl_logprobs(dtype, monkeypatch):
    from verl.utils.torch_functional import logprobs_from_logits

    monkeypatch.setitem(sys.modules, "verl.utils.torch_functional", None)  # import → ImportError: the stand-in
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # the benchmarks folder's modules, as the probe test does
    monkeypatch.delitem(sys.modules, "bench_topk_kl", raising=False)
    bench = importlib.import_module("bench_topk_kl")
    monkeypatch.delitem(sys.modules, "bench_topk_kl")  # a later import sees verl again
    assert bench.LOGPROB_SOURCE.startswith("verl absent")
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(37, 501, generator=g)).to(dtype)
    labels = torch.randint(0, 501, (37,), generator=g)
    torch.testing.assert_close(bench.logprobs_from_logits(logits, labels), logprobs_from_logits(logits, labels),
                               rtol=0, atol=0)  # fmt: skip


def test_gpu_check_script_names_existing_benchmarks():
    text = (REPO / "scripts" / "gpu_check.sh").read_text()
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_check.sh")]).returncode == 0
    for name in ("gpu_loss_check.py", "bench_topk_kl.py", "gpu_memory_probe.py"):
        assert f"benchmarks/{name}" in text and (REPO / "benchmarks" / name).is_file()
