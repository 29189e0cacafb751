"""GPU launch checks, for a GPU run only (`trainer.device` is not `cpu`; the CPU profile sets it):

* the per-GPU memory plan (`rpg.preflight.memory_config`, docs/gpu.md#memory-plan): exactly one line on stderr, the plan
  (`[rpg] GPU memory plan (per GPU, <model>, budget B GiB): rollout R GiB, update U GiB`) or why none was made (the
  model's config.json is neither on disk, in the Hugging Face cache nor in the shipped table); a phase over budget
  is an error, in a dry run and at launch, naming the phase, the numbers and the settings that would fit;
  (`RPG_MEMORY_PLAN=warn`, the opt-out of a user who measured, turns that error into a warning);
* what a local launch (no RAY_ADDRESS) needs on this node before Ray starts (`runtime_problems`): vLLM for
  `rollout.name=vllm`; for verl's default `attn_implementation=flash_attention_2` one of its two routes
  (`attention_route`, docs/gpu.md#install): the flash-attn package with its compiled extension loading, or, without
  it, the `kernels` package with which transformers (5.x, modeling_utils' FLASH_ATTN_KERNEL_FALLBACK) loads the Hub's
  prebuilt `kernels-community/flash-attn2`, loading here; an NVIDIA driver that answers and supports the CUDA version
  torch was built for (torch 2.11.0 from PyPI: CUDA 13.0, driver >= 580); at least `trainer.n_gpus_per_node` GPUs. A real launch refuses a missing one;
  a dry run prints them as warnings. Each message names its fix.

The driver, the GPUs' memory and flash-attn's extension are asked in a child process (`rpg.preflight.gpu_probe`):
the launcher creates no CUDA context (it would stay on GPU 0 in the process that hosts the Ray driver), and a driver
or an extension that crashes the process loading it becomes a message, not a dead launcher.

verl 0.9.1 needs flash-attn only through the attention implementation: `HFModelConfig` loads the model with
`override_config.attn_implementation` (default `flash_attention_2`, which transformers refuses without the package);
`use_remove_padding`'s pad/unpad helpers and the cross-entropy kernel fall back to PyTorch without it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable, Optional, Union

from omegaconf import DictConfig

from rpg.preflight.compose import RecipeConfigError
from rpg.preflight.gpu_probe import FLASH_ATTN_EXTENSION, NodeProbe, probe, torch_cuda_version
from rpg.preflight.memory_config import budget_from_env, memory_plan
from rpg.preflight.verl_configs import ValidatedConfig

# flash_attention_2's two install routes (docs/gpu.md#install). Each is written once, here: README.md's GPU quick start
# and docs/gpu.md show the same text, and the launcher's messages name it (tests/preflight/test_gpu_probe_on_cpu.py).
# The no-compiler route: the `kernels` package (in requirements-gpu.txt), with which transformers loads the Hub's build.
KERNELS_INSTALL = "pip install kernels==0.17.2"
KERNEL_REPO = "kernels-community/flash-attn2"  # transformers' FLASH_ATTN_KERNEL_FALLBACK["flash_attention_2"]
# The compile route, with everything it needs (Ubuntu 22.04/24.04, x86_64, run in the GPU virtualenv): a CUDA 13.0
# nvcc (torch's pip CUDA runtime has none; torch's extension builder refuses a 12.x one), CUDA_HOME, g++, the Python
# headers of the venv's Python, and ~9 GB of RAM per compile job (MAX_JOBS=8: ~70 GB; lower it on a smaller node).
FLASH_ATTN_COMPILE = (
    "wget https://developer.download.nvidia.com/compute/cuda/repos/$(. /etc/os-release; echo ubuntu${VERSION_ID/./})"
    "/x86_64/cuda-keyring_1.1-1_all.deb && sudo dpkg -i cuda-keyring_1.1-1_all.deb && sudo apt-get update\n"
    'sudo apt-get install -y cuda-toolkit-13-0 g++ "python$(python -c \'import sys; print(\"%d.%d\" % '
    "sys.version_info[:2])')-dev\"\n"
    "export CUDA_HOME=/usr/local/cuda-13.0 PATH=/usr/local/cuda-13.0/bin:$PATH\n"
    "pip install wheel ninja packaging\n"
    'MAX_JOBS=8 FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS="80;90" '
    "pip install --no-build-isolation --no-cache-dir flash-attn==2.8.3"
)
FLASH_ATTN_INSTALL = " && ".join(FLASH_ATTN_COMPILE.splitlines())  # the same commands as one line, for a message
# the oldest Linux driver for each CUDA major version torch is built for (within a major version, CUDA's minor-version
# compatibility lets a newer toolkit's build run on the major's first driver)
MIN_DRIVER = {13: "580", 12: "525"}
_FROM_TORCH = object()  # runtime_problems' default: read torch's CUDA version from torch/version.py
MEMORY_PLAN_ENV = "RPG_MEMORY_PLAN"
MEMORY_PLAN_CHOICES = ("enforce", "warn")


def is_gpu_run(config: DictConfig) -> bool:
    return str(config.trainer.get("device", "cuda")) != "cpu"


def memory_plan_mode(environ=os.environ) -> str:
    """RPG_MEMORY_PLAN: `enforce` (default: a plan over budget is an error) or `warn` (the opt-out of a user who
    measured: the plan's problems are printed as warnings and the launch goes on)."""
    mode = environ.get(MEMORY_PLAN_ENV, "").strip().lower() or "enforce"
    if mode not in MEMORY_PLAN_CHOICES:
        raise RecipeConfigError(
            f"{MEMORY_PLAN_ENV}={environ[MEMORY_PLAN_ENV]!r} is not valid; choose one of: "
            f"{' '.join(MEMORY_PLAN_CHOICES)}"
        )
    return mode


def check_memory_plan(validated: ValidatedConfig, budget_gib: Optional[float] = None, out=None,
                      node: Optional[NodeProbe] = None):
    """Print the plan line of a validated run (or why there is none) on `out` (stderr); raise RecipeConfigError if a
    phase is over budget (with RPG_MEMORY_PLAN=warn: print the problems as warnings instead). `node`: this node's NVML
    answers for the budget (default: asked in a child process when GPU_MEMORY_GIB is unset).

    Returns the `MemoryPlan`, or None when the model's shape is unknown or the engine is not estimated."""
    out = out or sys.stderr
    mode = memory_plan_mode()
    try:
        budget = budget_from_env(node) if budget_gib is None else float(budget_gib)
    except ValueError as e:  # a bad GPU_MEMORY_GIB
        raise RecipeConfigError(str(e)) from None
    try:
        plan = memory_plan(validated, budget_gib=budget)
    except ValueError as e:  # no config.json for the model, or an engine the plan does not cover
        print(f"[rpg] GPU memory plan: not computed: {e}", file=out)
        return None
    print(plan.line(), file=out)
    problems = plan.problems()
    if problems and mode == "warn":
        for problem in problems:
            print(f"[rpg] warning ({MEMORY_PLAN_ENV}=warn, going on): {problem}", file=out)
    elif problems:
        raise RecipeConfigError(
            "GPU memory plan over budget (docs/gpu.md#memory-plan):\n- " + "\n- ".join(problems) + f"\nIf you "
            f"measured that it fits (e.g. a smoke run's GPU peaks), set {MEMORY_PLAN_ENV}=warn to launch anyway."
        )
    return plan


def _probe_node(config: DictConfig, find_spec) -> NodeProbe:
    """NVML (driver, GPUs) and, when verl will use flash_attention_2, its route's kernel (flash-attn's compiled
    extension, or the Hub kernel through `kernels`): in one child process."""
    return probe(["nvml"] + (attention_questions(find_spec) if _wants_flash_attn(config) else []))


def attention_route(find_spec=None) -> str:
    """How `flash_attention_2` would load in this environment: "flash_attn" (the package: transformers and verl use
    it first), "kernels" (no flash-attn, but the `kernels` package and a transformers that falls back to the Hub's
    `kernels-community/flash-attn2` for it, modeling_utils.py `_check_and_adjust_attn_implementation`), or "" (neither:
    transformers refuses flash_attention_2)."""
    find_spec = find_spec or importlib.util.find_spec
    if find_spec("flash_attn") is not None:
        return "flash_attn"
    if find_spec("kernels") is not None and transformers_kernel_fallback(find_spec) == KERNEL_REPO:
        return "kernels"
    return ""


def transformers_kernel_fallback(find_spec=None) -> Optional[str]:
    """The Hub kernel transformers substitutes for flash_attention_2 without flash-attn (its
    `FLASH_ATTN_KERNEL_FALLBACK`, transformers >= 5), read from its source unimported; None for a transformers without
    the fallback (or none installed)."""
    spec = (find_spec or importlib.util.find_spec)("transformers")
    for folder in list(getattr(spec, "submodule_search_locations", None) or []):
        path = os.path.join(folder, "modeling_flash_attention_utils.py")
        try:
            text = open(path, encoding="utf-8").read()
        except OSError:
            continue
        marker = '"flash_attention_2": "'
        if "FLASH_ATTN_KERNEL_FALLBACK" in text and marker in text:
            return text.split(marker, 1)[1].split('"', 1)[0]
    return None


def attention_questions(find_spec=None) -> list[str]:
    """The probe's questions for flash_attention_2's route: its extension, or its Hub kernel."""
    route = attention_route(find_spec)
    return ["flash_attn"] if route == "flash_attn" else [f"kernels={KERNEL_REPO}"] if route == "kernels" else []


def _wants_flash_attn(config: DictConfig) -> bool:
    model = config.actor_rollout_ref.model
    override = model.get("override_config", None) or {}
    return override.get("attn_implementation", "flash_attention_2") == "flash_attention_2"


def runtime_problems(
    config: DictConfig,
    find_spec: Optional[Callable[[str], object]] = None,
    node: Optional[NodeProbe] = None,
    torch_cuda: Union[str, None, object] = _FROM_TORCH,
) -> list[str]:
    """What this node lacks to run `config` locally, each with its fix: vLLM and flash-attn importable, flash-attn's
    compiled extension loading, a driver that answers and supports torch's CUDA, at least `n_gpus_per_node` GPUs.
    `find_spec` (default importlib.util.find_spec), `node` (default: `probe` in a child process) and `torch_cuda`
    (torch's CUDA version, default read from torch/version.py): for tests."""
    find_spec = find_spec or importlib.util.find_spec
    node = node if node is not None else _probe_node(config, find_spec)
    torch_cuda = torch_cuda_version() if torch_cuda is _FROM_TORCH else torch_cuda
    problems, python = [], sys.executable
    if str(config.actor_rollout_ref.rollout.name) == "vllm" and find_spec("vllm") is None:
        problems.append(
            f"actor_rollout_ref.rollout.name=vllm, but vllm cannot be imported by {python}. Fix: install the GPU "
            f"requirements in this environment (pip install -r requirements-gpu.txt, docs/gpu.md#install), or set "
            f"PYTHON to the interpreter that has them"
        )
    problems += attention_problems(config, find_spec, node, torch_cuda, python)
    problems += driver_problems(node, torch_cuda, python)
    need, have = int(config.trainer.n_gpus_per_node), node.gpu_count
    if have is not None and have < need:  # unknown (no driver): the driver's problem above says it
        fix = f"N_GPUS={have}" if have else "run on a GPU node"
        problems.append(
            f"trainer.n_gpus_per_node={need} (recipe knob N_GPUS), but the NVIDIA driver shows "
            f"{have or 'no'} GPU(s) on this node (NVML). Fix: {fix}"
        )
    return problems


def attention_problems(
    config: DictConfig, find_spec, node: NodeProbe, torch_cuda: Optional[str], python: str = sys.executable
) -> list[str]:
    """flash_attention_2 (verl's default) without a route, or with a route whose kernel does not load here."""
    if not _wants_flash_attn(config):
        return []
    attn = "actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2 (verl's default)"
    sdpa = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
    route = attention_route(find_spec)
    problems = []
    if not route:
        problems.append(
            f"{attn} needs flash-attn or, without a compiler, the `kernels` package (transformers then loads the "
            f"Hub's prebuilt {KERNEL_REPO}); {python} has neither. Fix: {KERNELS_INSTALL} (in requirements-gpu.txt), "
            f"or compile flash-attn: {FLASH_ATTN_INSTALL}, or run with {sdpa} (docs/gpu.md#install)"
        )
    elif route == "kernels" and node.kernels_error:
        problems.append(
            f"{attn}: flash-attn is not installed, so transformers loads the Hub kernel {KERNEL_REPO} through the "
            f"`kernels` package in every worker, and it does not load on this node ({node.kernels_error}). Fix: give "
            f"this node Hugging Face Hub access once (the kernel is then in the HF cache; HF_HUB_OFFLINE=1 afterwards "
            f"reads it there), or set HF_HOME to a cache that holds it (docs/gpu.md#install), or install flash-attn: "
            f"{FLASH_ATTN_INSTALL}, or run with {sdpa}"
        )
    elif route == "flash_attn" and node.flash_attn_error:
        problems.append(
            f"{attn}: flash-attn is installed but its compiled extension {FLASH_ATTN_EXTENSION} does not load "
            f"({node.flash_attn_error}); every worker would fail the same way when it loads the model. It was built "
            f"against another torch or CUDA than this environment's (torch's CUDA: {torch_cuda}). Fix: rebuild it "
            f"here: pip uninstall -y flash-attn && {FLASH_ATTN_INSTALL}, or uninstall it and use the Hub kernel "
            f"({KERNELS_INSTALL}; docs/gpu.md#install)"
        )
    return problems


def driver_problems(node: NodeProbe, torch_cuda: Optional[str], python: str) -> list[str]:
    if node.crashed:
        return [
            f"{node.crashed}. A driver that crashes the process asking it would crash every worker. Fix: check "
            f"the driver with nvidia-smi (reload it or reboot the node)"
        ]
    if node.nvml_error:
        return [
            f"no NVIDIA driver answers on this node ({node.nvml_error}), so torch would see no GPU. Fix: run on "
            f"a GPU node whose driver is loaded (nvidia-smi lists the GPUs), or RPG_PROFILE=cpu for the CPU "
            f"profile"
        ]
    if torch_cuda is None:
        return [
            f"torch in {python} is not a CUDA build (torch.version.cuda is None). Fix: a fresh virtualenv with "
            f"pip install -r requirements-gpu.txt (docs/gpu.md#install), or set PYTHON to its interpreter"
        ]
    if node.driver_cuda is None:
        return []
    major = int(str(torch_cuda).split(".")[0])
    if major <= node.driver_cuda[0]:
        return []  # the same major version runs on its first driver (CUDA minor-version compatibility)
    have = "{}.{}".format(*node.driver_cuda)
    return [
        f"torch in {python} is built for CUDA {torch_cuda}, but the NVIDIA driver {node.driver} supports CUDA up to "
        f"{have} (nvidia-smi's \"CUDA Version\"): torch would see no GPU. Fix: upgrade the driver to "
        f"{MIN_DRIVER.get(major, 'the one for CUDA ' + str(major))} or newer, or install the CUDA 12 builds of torch "
        f"and vLLM (docs/gpu.md#older-drivers)"
    ]


def check_gpu_launch(validated: ValidatedConfig, *, dry_run: bool, local: bool, out=None) -> None:
    """The GPU checks of `rpg.launch.run` on a validated run (nothing for a CPU run): the memory plan, then, for a
    local launch or any dry run, what the node lacks (an error at launch, a warning in a dry run)."""
    config = validated.config
    if not is_gpu_run(config):
        return
    out = out or sys.stderr
    if not (dry_run or local):  # a Ray job: the budget is this node's GPU (or GPU_MEMORY_GIB), the rest the cluster's
        check_memory_plan(validated, out=out)
        return
    node = _probe_node(config, importlib.util.find_spec)  # one child process for the driver, the GPUs, flash-attn
    check_memory_plan(validated, out=out, node=node)
    problems = runtime_problems(config, node=node)
    if dry_run:
        for problem in problems:
            print(f"[rpg] dry run: a local launch would refuse: {problem}", file=out)
    elif problems:
        raise RecipeConfigError("this node cannot run the config:\n- " + "\n- ".join(problems))
