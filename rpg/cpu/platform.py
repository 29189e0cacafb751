"""A "cpu" platform for verl 0.9.1, so the unmodified trainer, workers and FSDP2 engine run on a machine without GPU.

verl 0.9.1 ships platforms for CUDA, ROCm and NPU only (`verl.plugin.platform`). This module adds one through verl's
own extension point, `PlatformRegistry.register("cpu")`, plus the three small shims that verl's code paths need on
CPU (each documented below, none edits verl files; each checks the verl version and the signature of what it
replaces first, `rpg.compat`, and fails at start-up naming both on a verl it was not written for):

1. gloo process groups: verl builds ``backend="cpu:gloo,{device}:{backend}"``, which is ``"cpu:gloo,cpu:gloo"`` on
   CPU and torch rejects it ("Duplicate device type cpu"). `initialize_global_process_group_ray` is wrapped so that
   its default backend is plain ``"gloo"``.
2. No pinned memory: FSDP2 forward-only engines (the reference model) use ``CPUOffloadPolicy(pin_memory=True)``,
   and pinning needs an accelerator. verl's alias is replaced by a subclass that forces ``pin_memory=False``.
3. Engine selection: verl registers its FSDP engine for devices "cuda"/"npu" only. ``VERL_ENGINE_DEVICE=cuda``
   (verl's own override in `EngineRegistry.get_engine_cls`) selects it; the engine itself asks the platform for the
   device, which is "cpu".

How to use it (the CPU profile of the recipe launcher, `rpg/preflight/recipe_argv.py`, does this)::

    export VERL_PLATFORM=cpu VERL_USE_EXTERNAL_MODULES=rpg.cpu.platform,rpg.cpu.hf_rollout

`import verl` then imports this module first thing in every process (driver, TaskRunner, workers, servers), which
registers the platform and applies the shims. Importing it in a process where ``VERL_PLATFORM`` is not ``cpu`` only
registers the platform class (harmless for GPU runs) and applies nothing; call `install()` to force the shims
(in-process tests). Config settings a CPU run also needs (eager/SDPA attention, fsdp2, fp32) are Hydra settings of
`rpg/config/profile/cpu.yaml`, not code. These shims are not rows of the table of patch points (`rpg.patches`,
whose docstring says why): they are a CPU run's platform, loaded by ``VERL_USE_EXTERNAL_MODULES``, not a feature that
``RPG_INSTALL`` selects.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import types
from contextlib import contextmanager
from typing import Any, Optional

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from rpg.compat import SUPPORTED_VERL, require_signature, require_version

__all__ = ["PLATFORM_NAME", "PlatformCPU", "install", "is_requested"]

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"
SHIMS = "rpg's CPU-platform shims (rpg/cpu/platform.py)"


def _noop(*args, **kwargs) -> None:
    return None


def _zero(*args, **kwargs) -> int:
    return 0


def _make_device_module() -> types.SimpleNamespace:
    """`torch.cpu` plus the `torch.cuda`-style calls verl makes on ``get_torch_device()`` (memory stats, RNG, ...).

    Memory queries return 0 (or the host RAM for ``mem_get_info``); cache/peak-stat management is a no-op.
    """
    mod = types.SimpleNamespace(**{n: getattr(torch.cpu, n) for n in dir(torch.cpu) if not n.startswith("_")})
    for name in ("empty_cache", "ipc_collect", "reset_peak_memory_stats", "set_per_process_memory_fraction",
                 "set_device", "synchronize"):
        setattr(mod, name, _noop)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(mod, name, _zero)
    mod.mem_get_info = lambda *a, **k: (psutil.virtual_memory().available, psutil.virtual_memory().total)
    mod.get_rng_state, mod.set_rng_state = torch.get_rng_state, torch.set_rng_state
    mod.manual_seed = mod.manual_seed_all = torch.manual_seed
    mod.get_device_name = lambda *a, **k: "cpu"
    mod.is_available = lambda: True
    mod.current_device = lambda: "cpu"
    mod.device_count = lambda: 1
    return mod


CPU_DEVICE_MODULE = _make_device_module()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform for plain CPU: device "cpu", gloo collectives, Ray resource "GPU" (faked with num_gpus=1).

    The Ray resource stays "GPU" because verl's resource pool hard-codes GPU bundles; a CPU run starts Ray with a
    logical ``num_gpus`` (see `cpu_profile` in `rpg/preflight/recipe_argv.py`). Never auto-detected: selected only by
    ``VERL_PLATFORM=cpu``.
    """

    device_name = PLATFORM_NAME
    vendor_name = PLATFORM_NAME

    @property
    def device_module(self):
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected; only VERL_PLATFORM=cpu selects it

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def is_requested() -> bool:
    """True when this process runs under ``VERL_PLATFORM=cpu``."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


_INSTALLED = False


def _gloo_default(orig):
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return orig(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray.__wrapped__ = orig
    initialize_global_process_group_ray.__doc__ = f"CPU (gloo) default for verl's function.\n\n{orig.__doc__ or ''}"
    return initialize_global_process_group_ray


def install() -> None:
    """Apply the CPU shims (idempotent) and make "cpu" the current verl platform.

    Patches the module attributes verl reads (`verl.utils.distributed.initialize_global_process_group_ray`,
    `verl.utils.fsdp_utils.CPUOffloadPolicy`), and the copies bound by ``from ... import`` in modules that are already
    imported (`verl.workers.engine_workers`, `verl.workers.engine.fsdp.transformer_impl`). Sets
    ``VERL_ENGINE_DEVICE=cuda`` if unset so verl's FSDP engine is selected. Checks the verl version and the
    signatures of what it replaces first (`rpg.compat`): on another verl it raises, naming both, before patching.
    """
    global _INSTALLED
    if _INSTALLED:
        return
    import verl.plugin.platform.platform_manager as pm
    import verl.utils.distributed as vdist
    import verl.utils.fsdp_utils as fsdp_utils

    require_version("verl", SUPPORTED_VERL, SHIMS)  # also covers set_platform/_current_platform of the manager
    require_signature(vdist.initialize_global_process_group_ray, ("timeout_second", "backend"), SHIMS)
    if fsdp_utils.CPUOffloadPolicy is not None:
        require_signature(fsdp_utils.CPUOffloadPolicy, ("pin_memory",), SHIMS)
    os.environ.setdefault("VERL_PLATFORM", PLATFORM_NAME)
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")

    current = pm._current_platform
    if current is None or current.device_name != PLATFORM_NAME:
        pm.set_platform(PlatformCPU())

    init_pg = _gloo_default(vdist.initialize_global_process_group_ray)
    vdist.initialize_global_process_group_ray = init_pg

    no_pin_policy = None
    if fsdp_utils.CPUOffloadPolicy is not None:

        @dataclasses.dataclass
        class NoPinCPUOffloadPolicy(fsdp_utils.CPUOffloadPolicy):
            """FSDP2 CPU offload without pinned memory (pinning needs an accelerator)."""

            def __post_init__(self):
                self.pin_memory = False

        no_pin_policy = NoPinCPUOffloadPolicy
        fsdp_utils.CPUOffloadPolicy = no_pin_policy

    # modules that bound the originals with `from ... import` before we ran
    bound = {
        "verl.workers.engine_workers": {"initialize_global_process_group_ray": init_pg},
        "verl.workers.engine.fsdp.transformer_impl": {"CPUOffloadPolicy": no_pin_policy},
    }
    for mod_name, attrs in bound.items():
        mod = sys.modules.get(mod_name)
        for attr, value in attrs.items():
            if mod is not None and value is not None and hasattr(mod, attr):
                setattr(mod, attr, value)
    _INSTALLED = True
    logger.info("rpg.cpu.platform: CPU platform installed (gloo, no pin_memory, VERL_ENGINE_DEVICE=%s)",
                os.environ["VERL_ENGINE_DEVICE"])


if is_requested():
    install()
