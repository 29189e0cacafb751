"""The GPU launch probes without a GPU (rpg/preflight/gpu_probe.py, rpg/preflight/gpu.py; docs/gpu.md#install): the
real child process runs against fake `pynvml`, `torch` and `flash_attn_2_cuda` modules put first on its PYTHONPATH,
and every failure's message (with its fix) is shown here. A child that aborts (a broken driver) is a message, and
the launcher lives on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rpg.preflight import gpu, gpu_probe
from rpg.preflight.gpu_probe import NodeProbe

GIB = 1 << 30
H100 = 85_520_809_984  # NVML's total memory of an H100 80GB HBM3 (79.6 GiB)


def _fakes(tmp_path: Path, *, cuda: int = 13000, driver: str = "580.65.06", gpus: int = 8, abort: bool = False,
           nvml_error: str = "", flash_error: str = "") -> dict:  # fmt: skip
    """A folder of fake modules for the child and the environment that puts it first on its path."""
    init = "import os; os.abort()" if abort else (f"raise RuntimeError({nvml_error!r})" if nvml_error else "pass")
    (tmp_path / "pynvml.py").write_text(
        f"def nvmlInit():\n    {init}\n"
        "def nvmlShutdown(): pass\n"
        f"def nvmlSystemGetDriverVersion(): return {driver!r}\n"
        f"def nvmlSystemGetCudaDriverVersion(): return {cuda}\n"
        f"def nvmlDeviceGetCount(): return {gpus}\n"
        "def nvmlDeviceGetHandleByIndex(i): return i\n"
        "class _Mem: total = %d\n"
        "def nvmlDeviceGetMemoryInfo(handle): return _Mem()\n" % H100
    )
    (tmp_path / "torch.py").write_text("")  # the extension needs torch loaded first; a fake keeps the child fast
    ext = f"raise ImportError({flash_error!r})" if flash_error else ""
    (tmp_path / f"{gpu_probe.FLASH_ATTN_EXTENSION}.py").write_text(ext + "\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def _probe(tmp_path, what=("nvml", "flash_attn"), **fake) -> NodeProbe:
    return gpu_probe.probe(what, env=_fakes(tmp_path, **fake))


@pytest.fixture(scope="module")
def config():
    return OmegaConf.create({
        "trainer": {"n_gpus_per_node": 8, "device": "cuda"},
        "actor_rollout_ref": {"rollout": {"name": "vllm"}, "model": {"override_config": {}}},
    })  # fmt: skip


def _problems(config, node, torch_cuda="13.0", missing=()):
    return gpu.runtime_problems(config, find_spec=lambda name: None if name in missing else object(), node=node,
                                torch_cuda=torch_cuda)  # fmt: skip


def test_a_healthy_node(tmp_path, config):
    node = _probe(tmp_path)
    assert (node.driver, node.driver_cuda, node.gpu_count, node.flash_attn_error) == ("580.65.06", (13, 0), 8, None)
    assert _problems(config, node) == []
    assert _problems(config, NodeProbe(driver="535.104", driver_cuda=(12, 2), gpu_total_bytes=[H100] * 8),
                     torch_cuda="12.8") == []  # fmt: skip  (same major version: minor-version compatibility)


def test_a_driver_older_than_torchs_cuda(tmp_path, config):
    (problem,) = _problems(config, _probe(tmp_path, cuda=12020, driver="535.104.05"))
    print(problem)
    assert "built for CUDA 13.0, but the NVIDIA driver 535.104.05 supports CUDA up to 12.2" in problem
    assert "torch would see no GPU" in problem
    assert "upgrade the driver to 580 or newer" in problem and "docs/gpu.md#older-drivers" in problem


def test_a_flash_attn_extension_that_does_not_load(tmp_path, config):
    node = _probe(tmp_path, flash_error="flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")
    (problem,) = _problems(config, node)
    print(problem)
    assert "flash-attn is installed but its compiled extension flash_attn_2_cuda does not load" in problem
    assert "undefined symbol: _ZN3c104cuda9SetDeviceEi" in problem
    assert "pip uninstall -y flash-attn && " + gpu.FLASH_ATTN_INSTALL in problem
    assert gpu.KERNELS_INSTALL in problem  # or the Hub kernel instead
    assert 'FLASH_ATTN_CUDA_ARCHS="80;90"' in problem and "--no-build-isolation" in problem
    sdpa = OmegaConf.merge(config, {"actor_rollout_ref": {"model": {"override_config": {"attn_implementation": "sdpa"}}}})
    assert _problems(sdpa, node) == []  # flash-attn is not loaded then


def test_flash_attn_missing_names_the_three_routes(config):
    (problem,) = _problems(config, NodeProbe(driver_cuda=(13, 0), gpu_total_bytes=[H100] * 8), missing={"flash_attn"})
    assert "needs flash-attn or, without a compiler, the `kernels` package" in problem
    assert gpu.KERNELS_INSTALL in problem and gpu.FLASH_ATTN_INSTALL in problem
    assert "attn_implementation=sdpa" in problem


def _with_transformers(tmp_path, missing=("flash_attn",), fallback=True):
    """A find_spec whose transformers (a folder in tmp_path) has, or lacks, the Hub fallback for flash_attention_2."""
    from types import SimpleNamespace

    folder = tmp_path / "transformers"
    folder.mkdir(exist_ok=True)
    mapping = 'FLASH_ATTN_KERNEL_FALLBACK = {\n    "flash_attention_2": "kernels-community/flash-attn2",\n}\n'
    (folder / "modeling_flash_attention_utils.py").write_text(mapping if fallback else "")
    transformers = SimpleNamespace(submodule_search_locations=[str(folder)])
    return lambda name: None if name in missing else transformers if name == "transformers" else object()


def test_the_no_compiler_route_is_accepted_when_its_hub_kernel_loads(tmp_path, config):
    """No flash-attn, but `kernels` and a transformers that falls back to kernels-community/flash-attn2: the child
    loads the Hub kernel as every worker would (a fake `kernels` module here); loaded, nothing is refused."""
    spec = _with_transformers(tmp_path)
    assert gpu.attention_route(spec) == "kernels" and gpu.attention_questions(spec) == [f"kernels={gpu.KERNEL_REPO}"]
    (tmp_path / "kernels.py").write_text(
        "import os\n"
        "def get_kernel(repo):\n"
        "    if os.environ.get('ABORT'):\n"
        "        os.abort()\n"
        "    if os.environ.get('HF_HUB_OFFLINE'):\n"
        "        raise FileNotFoundError(f'{repo}: not in the Hugging Face cache and HF_HUB_OFFLINE=1')\n"
        "    class K: flash_attn_varlen_func = staticmethod(lambda *a: None)\n"
        "    return K\n"
    )
    question = ["nvml", f"kernels={gpu.KERNEL_REPO}"]
    node = gpu_probe.probe(question, env=_fakes(tmp_path))
    assert node.kernels_error is None
    assert gpu.runtime_problems(config, find_spec=spec, node=node, torch_cuda="13.0") == []
    offline = gpu_probe.probe(question, env={**_fakes(tmp_path), "HF_HUB_OFFLINE": "1"})
    (problem,) = gpu.runtime_problems(config, find_spec=spec, node=offline, torch_cuda="13.0")
    print(problem)
    assert "loads the Hub kernel kernels-community/flash-attn2 through the `kernels` package" in problem
    assert "not in the Hugging Face cache and HF_HUB_OFFLINE=1" in problem and "Hub access once" in problem
    assert gpu.FLASH_ATTN_INSTALL in problem and "attn_implementation=sdpa" in problem
    crashed = gpu_probe.probe(question, env={**_fakes(tmp_path), "ABORT": "1"})  # its own child: the driver is fine
    assert crashed.gpu_count == 8 and "died (signal 6)" in crashed.kernels_error
    old = _with_transformers(tmp_path, fallback=False)  # a transformers without the fallback: no route
    assert gpu.attention_route(old) == ""
    (problem,) = gpu.runtime_problems(config, find_spec=old, node=node, torch_cuda="13.0")
    assert "needs flash-attn or, without a compiler" in problem


def test_the_installed_transformers_falls_back_to_the_hub_kernel():
    """The fact the no-compiler route stands on, read from this environment's transformers (5.x)."""
    assert gpu.transformers_kernel_fallback() == gpu.KERNEL_REPO


def test_one_install_text_in_the_readme_the_docs_and_the_messages():
    """Each route's commands are written once (rpg/preflight/gpu.py): the compile route is shown as it is in
    docs/gpu.md#compile, which README.md's install step names; the messages carry the same commands on one line; the
    no-compiler route's `kernels` pin is requirements-gpu.txt's, which the README installs."""
    root = Path(__file__).resolve().parents[2]
    docs, readme = ((root / doc).read_text(encoding="utf-8") for doc in ("docs/gpu.md", "README.md"))
    assert gpu.FLASH_ATTN_COMPILE in docs, "docs/gpu.md does not show rpg/preflight/gpu.py's FLASH_ATTN_COMPILE"
    assert '<a id="compile"></a>' in docs and "docs/gpu.md#compile" in readme
    assert gpu.KERNELS_INSTALL.split()[-1] in (root / "requirements-gpu.txt").read_text().splitlines()
    assert "pip install -r requirements-gpu.txt" in readme and "flash-attn==" not in readme  # no compiler there
    assert gpu.FLASH_ATTN_INSTALL == " && ".join(gpu.FLASH_ATTN_COMPILE.splitlines())
    for needed in ("cuda-toolkit-13-0", "CUDA_HOME=", "g++", "-dev", "MAX_JOBS="):
        assert needed in gpu.FLASH_ATTN_COMPILE


def test_a_driver_that_crashes_the_probe_is_a_message(tmp_path, config):
    node = _probe(tmp_path, abort=True)
    assert node.crashed.startswith("the GPU probe (nvml flash_attn) died (signal 6)")
    (problem,) = _problems(config, node)
    print(problem)
    assert "crash every worker" in problem and "nvidia-smi" in problem


def test_no_driver(tmp_path, config):
    node = _probe(tmp_path, what=("nvml",), nvml_error="NVML Shared Library Not Found")
    assert "NVML Shared Library Not Found" in node.nvml_error and node.gpu_count is None
    (problem,) = _problems(config, node)
    print(problem)
    assert problem.startswith("no NVIDIA driver answers on this node") and "RPG_PROFILE=cpu" in problem


def test_a_cpu_torch(config):
    (problem,) = _problems(config, NodeProbe(driver_cuda=(13, 0), gpu_total_bytes=[H100] * 8), torch_cuda=None)
    assert "is not a CUDA build (torch.version.cuda is None)" in problem and "requirements-gpu.txt" in problem


@pytest.mark.parametrize("gpus, needle", [(4, "shows 4 GPU(s) on this node (NVML). Fix: N_GPUS=4"),
                                          (0, "shows no GPU(s) on this node (NVML). Fix: run on a GPU node")])
def test_fewer_gpus_than_asked(config, gpus, needle):
    (problem,) = _problems(config, NodeProbe(driver_cuda=(13, 0), gpu_total_bytes=[H100] * gpus))
    assert problem.startswith("trainer.n_gpus_per_node=8 (recipe knob N_GPUS)") and needle in problem


def test_an_interpreter_that_cannot_start_is_a_message():
    node = gpu_probe.probe(("nvml",), python="/nonexistent/python")
    assert node.crashed.startswith("the GPU probe could not start /nonexistent/python")


def test_the_budget_is_the_smallest_gpu_from_nvml(tmp_path, monkeypatch):
    from rpg.preflight.memory_config import budget_from_env

    monkeypatch.delenv("GPU_MEMORY_GIB", raising=False)
    node = _probe(tmp_path, what=("nvml",))
    assert budget_from_env(node) == pytest.approx(H100 / GIB)
    assert budget_from_env(NodeProbe(gpu_total_bytes=[H100, 40 * GIB])) == 40.0
    assert budget_from_env(NodeProbe(nvml_error="no driver")) == 80.0  # nothing known: the nominal 80
    monkeypatch.setenv("GPU_MEMORY_GIB", "141")
    assert budget_from_env(node) == 141.0


def test_torch_cuda_version_is_read_without_importing_torch(tmp_path):
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    (pkg / "version.py").write_text("from typing import Optional\n__version__ = '2.11.0'\ncuda: Optional[str] = '13.0'\n")
    spec = type("Spec", (), {"submodule_search_locations": [str(pkg)]})()
    assert gpu_probe.torch_cuda_version(lambda name: spec) == "13.0"
    (pkg / "version.py").write_text("cuda = None\n")
    assert gpu_probe.torch_cuda_version(lambda name: spec) is None
    assert gpu_probe.torch_cuda_version(lambda name: None) is None  # no torch
    assert "torch" not in sys.modules or sys.modules["torch"].__file__ != str(pkg / "__init__.py")
