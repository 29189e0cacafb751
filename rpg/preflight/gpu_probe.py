"""What this node's NVIDIA driver, GPUs and flash-attn say, asked in a child process (docs/gpu.md#install).

The launcher must not touch CUDA itself: a CUDA context it created on GPU 0 would stay there for the whole run in the
process that then hosts the Ray driver, and a broken driver or a flash-attn extension built for another torch can
crash the process that loads it (a segfault, an abort), not just raise. So the GPU-only questions run in a child
Python (`probe`): this file, run as a script (`python gpu_probe.py nvml flash_attn`; it imports nothing of `rpg`, so
the child starts in a fraction of a second when only NVML is asked), prints one JSON object. The parent reads it into
a `NodeProbe`; a child that crashes, hangs or prints garbage becomes `NodeProbe.crashed`, a message, never an
exception in the launcher.

* **nvml**: the driver version, the highest CUDA version the driver supports (`nvmlSystemGetCudaDriverVersion`, e.g.
  12020 for 12.2), the GPUs' total memory. From `pynvml` (the nvidia-ml-py package, which vLLM 0.24.0 brings through
  flashinfer-python's requirements); without it, `nvidia-smi`. NVML creates no CUDA context.
* **flash_attn**: `import torch` then `import flash_attn_2_cuda`, the compiled extension flash-attn 2.x loads on first
  use. `find_spec("flash_attn")` only finds the Python package; an extension built against another torch or CUDA
  fails here with the loader's message (`undefined symbol: ...`), as it would inside every worker.
* **kernels=REPO** (the no-compiler route, docs/gpu.md#install): `import torch`, then the `kernels` package's
  `get_kernel(REPO)`, what transformers does in every worker for `flash_attention_2` when flash-attn is not installed
  (the Hub's prebuilt `kernels-community/flash-attn2`): a node without Hub access and without the kernel in its
  Hugging Face cache fails here, before Ray starts, not when the workers load the model.
* **cuda** (for `rpg-doctor`): torch's compiled pieces (CUDA, cuDNN, NCCL versions) and each GPU's total memory as
  `torch.cuda.mem_get_info()` reports it, which is what vLLM sizes its pool from (a few hundred MiB under NVML's).
  This one creates a CUDA context: the doctor asks it, the launcher never does.
* **vllm** (for `rpg-doctor`): `import torch` then `import vllm._C`, vLLM's compiled ops.

torch's own CUDA version is read from `torch/version.py` without importing torch (`torch_cuda_version`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

FLASH_ATTN_EXTENSION = "flash_attn_2_cuda"
PROBE_TIMEOUT_S = 120.0  # importing torch and flash-attn on a cold filesystem can take a while
KERNEL_TIMEOUT_S = 600.0  # the Hub kernel's first download (its own child: a slow one is the kernel's problem)
NO_NVML = "no pynvml (pip install nvidia-ml-py) and no nvidia-smi on PATH"


@dataclass
class NodeProbe:
    """The child's answers. `driver_cuda` is (major, minor) of the newest CUDA the driver supports."""

    driver: str = ""
    driver_cuda: Optional[tuple[int, int]] = None
    gpu_total_bytes: list[int] = field(default_factory=list)
    nvml_error: str = ""  # why NVML (and nvidia-smi) gave nothing: no driver, no GPU, ...
    flash_attn_error: Optional[str] = None  # None: loaded, or not asked
    kernels_error: Optional[str] = None  # None: the Hub kernel loaded, or not asked
    cuda: dict = field(default_factory=dict)  # the `cuda` question's answers (doctor only)
    vllm_error: Optional[str] = None  # None: vllm._C loaded, or not asked
    crashed: str = ""  # the child died, hung or printed no JSON: what happened

    @property
    def gpu_count(self) -> Optional[int]:
        return None if self.nvml_error or self.crashed else len(self.gpu_total_bytes)


def probe(
    what: Sequence[str] = ("nvml",),
    python: str = sys.executable,
    timeout: float = PROBE_TIMEOUT_S,
    env: Optional[dict] = None,
) -> NodeProbe:
    """Run this file in a child `python` asking `what` (nvml, flash_attn, kernels=REPO, cuda, vllm); never raises.
    Without pynvml and nvidia-smi there is nothing NVML could answer, so an NVML-only question starts no child (CPU
    machines)."""
    kernels = [q for q in what if q.startswith("kernels=")]
    if kernels and len(kernels) < len(what):  # the Hub kernel in a child of its own, with a download's timeout
        node = probe([q for q in what if q not in kernels], python, timeout, env)
        kernel = probe(kernels, python, max(timeout, KERNEL_TIMEOUT_S), env)
        return dataclasses.replace(node, kernels_error=kernel.kernels_error or kernel.crashed or None)
    nothing_to_ask = importlib.util.find_spec("pynvml") is None and shutil.which("nvidia-smi") is None
    if list(what) == ["nvml"] and python == sys.executable and env is None and nothing_to_ask:
        return NodeProbe(nvml_error=NO_NVML)
    cmd = [python, os.path.abspath(__file__), *what]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return NodeProbe(crashed=f"the GPU probe ({' '.join(what)}) did not answer within {timeout:.0f} s")
    except OSError as e:
        return NodeProbe(crashed=f"the GPU probe could not start {python}: {e}")
    lines = proc.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1])
    except (IndexError, ValueError):
        how = f"exit status {proc.returncode}" if proc.returncode >= 0 else f"signal {-proc.returncode}"
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return NodeProbe(crashed=f"the GPU probe ({' '.join(what)}) died ({how}): {tail}")
    cuda = data.get("driver_cuda")
    return NodeProbe(
        driver=str(data.get("driver", "")),
        driver_cuda=(int(cuda) // 1000, int(cuda) % 1000 // 10) if cuda else None,
        gpu_total_bytes=[int(b) for b in data.get("gpu_total_bytes", [])],
        nvml_error=str(data.get("nvml_error", "")),
        flash_attn_error=data.get("flash_attn_error"),
        kernels_error=data.get("kernels_error"),
        cuda=dict(data.get("cuda") or {}),
        vllm_error=data.get("vllm_error"),
    )


def torch_cuda_version(find_spec=None) -> Optional[str]:
    """torch's `version.cuda` ('13.0'; None for a CPU build or no torch), read from torch/version.py unimported."""
    spec = (find_spec or importlib.util.find_spec)("torch")
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    for folder in locations:
        path = os.path.join(folder, "version.py")
        if os.path.isfile(path):
            scope: dict = {}
            try:
                exec(compile(open(path).read(), path, "exec"), scope)  # a few assignments, no imports of torch
            except Exception:  # noqa: BLE001 - an unreadable file: unknown
                return None
            cuda = scope.get("cuda")
            return str(cuda) if cuda else None
    return None


# ---------------------------------------------------------------------------------------------------------------
# The child's side (this file run as a script)
# ---------------------------------------------------------------------------------------------------------------
def _nvml() -> dict:
    try:
        import pynvml
    except ImportError:
        return _nvidia_smi(NO_NVML.split(" and ")[0])
    try:
        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
            totals = [
                int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return {"nvml_error": f"NVML: {type(e).__name__}: {e}"}
    return {
        "driver": driver.decode() if isinstance(driver, bytes) else str(driver),
        "driver_cuda": cuda,
        "gpu_total_bytes": totals,
    }


def _nvidia_smi(why: str) -> dict:
    try:
        head = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60)
        mem = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"nvml_error": f"{why}; nvidia-smi: {e}"}
    if mem.returncode != 0:
        return {"nvml_error": f"{why}; nvidia-smi: {(mem.stderr or mem.stdout).strip()[:300]}"}
    rows = [r.split(",") for r in mem.stdout.strip().splitlines() if r.strip()]
    cuda = None
    for token in head.stdout.split("CUDA Version:")[1:2]:
        major, _, minor = token.split()[0].partition(".")
        cuda = int(major) * 1000 + int(minor or 0) * 10
    return {
        "driver": rows[0][1].strip() if rows else "",
        "driver_cuda": cuda,
        "gpu_total_bytes": [int(float(r[0])) << 20 for r in rows],
    }


def _flash_attn() -> dict:
    try:
        import torch  # noqa: F401  (the extension links against libtorch: load it first, as flash_attn does)

        __import__(FLASH_ATTN_EXTENSION)
    except Exception as e:  # noqa: BLE001 - ImportError / OSError with the loader's message
        return {"flash_attn_error": f"{type(e).__name__}: {e}"}
    return {"flash_attn_error": None}


def _kernels(repo: str) -> dict:
    try:
        import torch  # noqa: F401

        from kernels import get_kernel

        kernel = get_kernel(repo)
        if getattr(kernel, "flash_attn_varlen_func", None) is None:
            raise ImportError(f"{repo} has no flash_attn_varlen_func (transformers' padding-free path needs it)")
    except Exception as e:  # noqa: BLE001 - no Hub access and no cache, no build for this torch/CUDA, ...
        return {"kernels_error": f"{type(e).__name__}: {str(e)[:400]}"}
    return {"kernels_error": None}


def _cuda() -> dict:
    try:
        import torch

        info: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None, "nccl": None}
        if torch.backends.cudnn.is_available():
            info["cudnn"] = torch.backends.cudnn.version()
        if torch.version.cuda and torch.cuda.is_available():
            info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
            info["total_bytes"] = [int(torch.cuda.mem_get_info(i)[1]) for i in range(torch.cuda.device_count())]
        else:
            info["total_bytes"] = []
    except Exception as e:  # noqa: BLE001 - a CUDA error while creating the context, ...
        return {"cuda": {"error": f"{type(e).__name__}: {str(e)[:300]}"}}
    return {"cuda": info}


def _vllm() -> dict:
    try:
        import torch  # noqa: F401

        import vllm._C  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return {"vllm_error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"vllm_error": None}


def _main(argv: Sequence[str]) -> None:
    out: dict = {}
    if "nvml" in argv:
        out.update(_nvml())
    if "flash_attn" in argv:
        out.update(_flash_attn())
    for arg in argv:
        if arg.startswith("kernels="):
            out.update(_kernels(arg.split("=", 1)[1]))
    if "cuda" in argv:
        out.update(_cuda())
    if "vllm" in argv:
        out.update(_vllm())
    sys.stdout.write("\n" + json.dumps(out) + "\n")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))  # run as a script: its folder must not shadow torch's imports
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    _main(sys.argv[1:])
