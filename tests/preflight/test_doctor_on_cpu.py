"""`rpg-doctor` (rpg/preflight/doctor.py; docs/gpu.md#doctor): each FAIL with its fix, from fake answers (versions,
probe results, the hub, the disk); one recipe judged by the launcher's own memory plan; and the real command on this
CPU machine, which says plainly that there is no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpg.preflight import doctor, gpu
from rpg.preflight.gpu_probe import NodeProbe

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
H100_NVML, H100_TORCH = 81_559 * MIB, 81_079 * MIB  # issue 33's H100: NVML's total vs torch.cuda.mem_get_info's
HEALTHY = NodeProbe(driver="580.65.06", driver_cuda=(13, 0), gpu_total_bytes=[H100_NVML] * 8,
                    cuda={"torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91300, "nccl": "2.27.7",
                          "total_bytes": [H100_TORCH] * 8})  # fmt: skip


def _by_name(lines):
    return {line.name: line for line in lines}


def test_packages_missing_or_off_their_pins():
    versions = {"torch": "2.10.0+cu128", "verl": "0.9.1", "transformers": "5.9.0"}
    lines = _by_name(doctor.package_lines(version=versions.get))
    assert lines["vllm"].status == "FAIL" and "requirements-gpu.txt" in lines["vllm"].fix
    assert lines["torch"].status == "WARN" and "pins 2.11.0" in lines["torch"].detail
    assert lines["verl"].status == "OK" and lines["transformers"].status == "OK"


def test_vllm_ops_that_do_not_load():
    line = doctor.vllm_line(NodeProbe(vllm_error="ImportError: _C.abi3.so: undefined symbol"), find_spec=lambda n: 1)
    assert line.status == "FAIL" and "undefined symbol" in line.detail and "requirements-gpu.txt" in line.fix


def test_flash_attention_2_without_a_route_and_with_a_hub_kernel_that_does_not_load(tmp_path):
    none = doctor.attention_line(HEALTHY, find_spec=lambda name: None)
    assert none.status == "FAIL" and none.fix.startswith(gpu.KERNELS_INSTALL) and gpu.FLASH_ATTN_INSTALL in none.fix
    from test_gpu_probe_on_cpu import _with_transformers  # a transformers with the Hub fallback

    spec = _with_transformers(tmp_path)
    offline = NodeProbe(kernels_error="FileNotFoundError: not in the Hugging Face cache")
    line = doctor.attention_line(offline, find_spec=spec)
    assert line.status == "FAIL" and "Hub access once" in line.fix
    line = doctor.attention_line(HEALTHY, find_spec=spec, version={"kernels": "0.17.2"}.get)
    assert line.status == "WARN" and "kernels 0.17.2" in line.detail and gpu.FLASH_ATTN_INSTALL in line.fix


def test_driver_and_gpus():
    no_gpu = _by_name(doctor.node_lines(NodeProbe(nvml_error="no pynvml and no nvidia-smi",
                                                  cuda={"torch": "2.13.0+cpu", "total_bytes": []}), None))  # fmt: skip
    assert no_gpu["driver"].status == "FAIL" and "RPG_PROFILE=cpu" in no_gpu["driver"].fix
    assert no_gpu["torch.cuda"].status == "FAIL" and "CPU build" in no_gpu["torch.cuda"].detail
    assert no_gpu["gpus"].status == "FAIL" and "no GPU" in no_gpu["gpus"].detail
    old = _by_name(doctor.node_lines(NodeProbe(driver="535.104.05", driver_cuda=(12, 2),
                                               gpu_total_bytes=[H100_NVML]), "13.0"))  # fmt: skip
    assert old["driver"].status == "FAIL" and "upgrade the driver to 580" in old["driver"].fix
    assert old["gpus"].status == "FAIL" and "torch sees none" in old["gpus"].detail
    ok = _by_name(doctor.node_lines(HEALTHY, "13.0"))
    assert ok["driver"].status == ok["gpus"].status == ok["torch.cuda"].status == "OK"
    assert "8 × 79.18 GiB (torch.cuda.mem_get_info total" in ok["gpus"].detail and "480 MiB more" in ok["gpus"].detail


def test_environment_ray_disk_hub_and_wandb(monkeypatch):
    env = {"NCCL_SOCKET_IFNAME": "eth0", "HOME": "/root"}
    assert doctor.network_line(env).detail == "NCCL_SOCKET_IFNAME=eth0"
    assert doctor.ray_line(env, version=lambda name: None).status == "FAIL"
    disk = doctor.disk_line({"CKPTS_DIR": "/nonexistent/ckpts"}, free=lambda path: 10e9)
    assert disk.status == "WARN" and "10.0 GB free at /" in disk.detail and "CKPTS_DIR" in disk.fix
    hub = _by_name(doctor.hub_lines({}, reach=lambda url, timeout: "URLError: Name or service not known"))
    assert hub["hf hub"].status == "WARN" and "HF_HUB_OFFLINE=1" in hub["hf hub"].fix
    assert _by_name(doctor.hub_lines({"HF_HUB_OFFLINE": "1"}))["hf hub"].status == "OK"
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    wandb = doctor.wandb_line({})
    assert wandb.status == "FAIL" and all(fix in wandb.fix for fix in ("wandb login", "WANDB_API_KEY", "WANDB_MODE"))
    assert doctor.wandb_line({"WANDB_MODE": "offline"}).status == "OK"


def test_a_recipe_judged_by_the_launchers_memory_plan(monkeypatch):
    """The doctor composes the recipe as its launch would and calls the launcher's checks: over budget is a FAIL."""
    monkeypatch.setenv("GPU_MEMORY_GIB", "20")
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "RAY_ADDRESS"))}
    lines = doctor.recipe_lines(ROOT / "recipe/rpg/4b/run_rpg_urkl_2k.sh", env, HEALTHY)
    named = _by_name(lines)
    assert lines[0].status == "OK" and lines[0].name == "4b/run_rpg_urkl_2k.sh"
    plan = named["memory plan"]
    assert plan.status == "FAIL" and "GPU memory plan over budget" in plan.detail and "budget 20" in plan.detail
    assert named["wandb"].status == "FAIL"


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU machine of the tests")
def test_the_real_doctor_on_this_cpu_machine():
    proc = subprocess.run([sys.executable, "-m", "rpg.preflight.doctor"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    print(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    names = [line.split()[1] for line in proc.stdout.splitlines() if line.split()[:1] in (["OK"], ["WARN"], ["FAIL"])]
    for name in ("python", "torch", "vllm", "verl", "transformers", "vllm._C", "flash-attn", "driver", "gpus",
                 "network", "ray", "disk", "hf", "wandb"):  # fmt: skip
        assert name in names, name
    assert "no GPU: NVML and torch see none on this machine" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("rpg-doctor: ")
