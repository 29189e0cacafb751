"""`rpg-doctor [RECIPE.sh ...]` (or `python -m rpg.preflight.doctor`): what this node has for a run, one line per check,
each OK / WARN / FAIL with its fix. Run it first on a new node, and paste its output into a bug report
(docs/gpu.md#doctor).

It prints: Python; torch, vLLM, verl, transformers and flash_attention_2's route (the flash-attn package or the Hub
kernel through `kernels`), with their compiled pieces loaded in a child process (`rpg.preflight.gpu_probe`: torch's
CUDA/cuDNN/NCCL, `vllm._C`, `flash_attn_2_cuda` or the Hub kernel); the NVIDIA driver and the CUDA version it
supports; the GPUs and their memory as vLLM sees it (`torch.cuda.mem_get_info`'s total, a few hundred MiB under
NVML's); the NCCL/network variables; Ray; free disk at CKPTS_DIR; the Hugging Face hub (cache, token, access); wandb
(credentials or offline mode); and, for each RECIPE script given, the launcher's own verdicts on it: the memory plan,
what a local launch would refuse on this node, its checkpoints' disk space, wandb; and a WARN for LoRA with the
disaggregated asynchronous trainer (verl #7495: the rollout samples the initial policy; the launcher refuses it).

The checks are the launcher's (`rpg.preflight.gpu`, `rpg.preflight.wandb_check`, `rpg.preflight.disk`,
`rpg.preflight.memory`): the doctor only calls them and prints their answers. Exit status 1 when a line is FAIL.
It lives in `rpg.preflight`, whose modules do not import verl at module level: a broken verl is a line here, not a
doctor that cannot start; only a RECIPE's composition imports verl.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from omegaconf import OmegaConf

from rpg.preflight import disk, gpu, gpu_probe, lora_rules, wandb_check
from rpg.preflight.compose import RecipeConfigError, compose_config
from rpg.preflight.validation import validate
from rpg.preflight.gpu_probe import NodeProbe

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
HUB_TIMEOUT_S = 5.0
NETWORK_ENV_PREFIXES = (
    "NCCL_",
    "GLOO_",
    "TP_SOCKET_",
    "UCX_",
    "FI_",
    "MASTER_",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "TORCH_NCCL_",
    "RAY_ADDRESS",
)
PINNED = {"torch": "2.11.0", "vllm": "0.24.0", "verl": "0.9.1"}  # requirements-gpu.txt: verl[vllm]==0.9.1's pins
GPU_ENV = "pip install -r requirements-gpu.txt in a fresh virtualenv (docs/gpu.md#install)"


@dataclass
class Line:
    status: str  # OK | WARN | FAIL
    name: str
    detail: str
    fix: str = ""

    def text(self) -> str:
        return f"{self.status:4} {self.name:13} {self.detail}" + (f"\n{'':19}fix: {self.fix}" if self.fix else "")


def _version(package: str) -> Optional[str]:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def python_line() -> Line:
    v = sys.version_info
    ok = (3, 10) <= v[:2] < (3, 13)
    return Line(
        "OK" if ok else "FAIL",
        "python",
        f"{v.major}.{v.minor}.{v.micro} ({sys.executable})",
        "" if ok else "verl 0.9.1 needs Python >=3.10,<3.13: python3.12 (Ubuntu 24.04) or python3.11",
    )


def package_lines(version: Callable[[str], Optional[str]] = _version) -> list[Line]:
    lines = []
    for name, pin in PINNED.items():
        have = version(name)
        if have is None:
            lines.append(Line("FAIL", name, "not installed", GPU_ENV))
        elif have.split("+")[0] != pin:
            lines.append(Line("WARN", name, f"{have} (requirements-gpu.txt pins {pin})", GPU_ENV))
        else:
            lines.append(Line("OK", name, have))
    have = version("transformers")
    lines.append(Line("OK", "transformers", have) if have else Line("FAIL", "transformers", "not installed", GPU_ENV))
    return lines


def attention_line(node: NodeProbe, find_spec=None, version: Callable[[str], Optional[str]] = _version) -> Line:
    """flash_attention_2's route here (gpu.attention_route) and whether its kernel loads (the launcher's message)."""
    route = gpu.attention_route(find_spec)
    problems = gpu.attention_problems(_FLASH_ATTENTION_2, find_spec or importlib.util.find_spec, node, None)
    if problems:
        detail, _, fix = problems[0].partition(" Fix: ")
        return Line("FAIL", "flash-attn", detail, fix)
    if route == "flash_attn":
        return Line("OK", "flash-attn", f"flash-attn {version('flash-attn')}, {gpu_probe.FLASH_ATTN_EXTENSION} loads")
    return Line(
        "WARN",
        "flash-attn",
        f"not installed; flash_attention_2 loads the Hub kernel {gpu.KERNEL_REPO} "
        f"(kernels {version('kernels')}): every node needs Hub access or the kernel in its HF cache, and verl "
        "falls back to torch's cross-entropy (more memory: docs/gpu.md#memory-plan)",
        f"for verl's Triton cross-entropy, compile flash-attn: {gpu.FLASH_ATTN_INSTALL}",
    )


# the smallest config `gpu.attention_problems` reads: the model's attn_implementation left at verl's default
_FLASH_ATTENTION_2 = OmegaConf.create({"actor_rollout_ref": {"model": {"override_config": {}}}})


def node_lines(node: NodeProbe, torch_cuda: Optional[str]) -> list[Line]:
    """The driver (the launcher's `gpu.driver_problems`), the GPUs by NVML and by torch (what vLLM sizes from)."""
    lines = []
    cuda = node.cuda or {}
    problems = gpu.driver_problems(node, torch_cuda, sys.executable)
    if problems:
        detail, _, fix = problems[0].partition(" Fix: ")
        lines.append(Line("FAIL", "driver", detail, fix))
    else:
        have = "{}.{}".format(*node.driver_cuda) if node.driver_cuda else "?"
        lines.append(
            Line("OK", "driver", f"NVIDIA {node.driver}, supports CUDA up to {have}; torch built for CUDA {torch_cuda}")
        )
    pieces = ", ".join(f"{k} {cuda[k]}" for k in ("torch", "cuda", "cudnn", "nccl") if cuda.get(k))
    if cuda.get("error"):
        lines.append(Line("FAIL", "torch.cuda", f"{cuda['error']} ({pieces})", "check the driver with nvidia-smi"))
    elif cuda.get("torch") and not cuda.get("cuda"):
        lines.append(
            Line("FAIL", "torch.cuda", f"torch {cuda['torch']} is a CPU build (torch.version.cuda is None)", GPU_ENV)
        )
    elif pieces:
        lines.append(Line("OK", "torch.cuda", pieces))
    nvml, seen = node.gpu_total_bytes, list(cuda.get("total_bytes") or [])
    if not nvml and not seen:
        lines.append(
            Line(
                "FAIL",
                "gpus",
                "no GPU: NVML and torch see none on this machine (a CPU machine: the GPU recipes cannot run here)",
                "run on a GPU node; on this machine: RPG_PROFILE=cpu (the CPU profile, docs/cpu.md)",
            )
        )
    elif not seen:
        lines.append(
            Line(
                "FAIL",
                "gpus",
                f"NVML shows {len(nvml)} GPU(s) but torch sees none",
                "a CUDA build of torch that this driver supports (the driver line)",
            )
        )
    else:
        detail = f"{len(seen)} × {min(seen) / GIB:.2f} GiB (torch.cuda.mem_get_info total: what vLLM budgets from)"
        if nvml:
            detail += f"; NVML: {min(nvml) / GIB:.2f} GiB ({(min(nvml) - min(seen)) / (1 << 20):.0f} MiB more)"
        lines.append(Line("OK", "gpus", detail))
    return lines


def vllm_line(node: NodeProbe, find_spec=None) -> Line:
    if (find_spec or importlib.util.find_spec)("vllm") is None:
        return Line("FAIL", "vllm._C", "vllm is not installed", GPU_ENV)
    if node.vllm_error:
        return Line(
            "FAIL",
            "vllm._C",
            f"vLLM's compiled ops do not load: {node.vllm_error}",
            "reinstall the pinned vllm and torch together: " + GPU_ENV,
        )
    return Line("OK", "vllm._C", "loads")


def network_line(environ: Mapping[str, str]) -> Line:
    found = {k: v for k, v in sorted(environ.items()) if k.startswith(NETWORK_ENV_PREFIXES)}
    text = " ".join(f"{k}={v}" for k, v in found.items()) or "none set (NCCL and Gloo choose the interfaces)"
    return Line("OK", "network env", text)


def ray_line(environ: Mapping[str, str], version: Callable[[str], Optional[str]] = _version) -> Line:
    have = version("ray")
    if have is None:
        return Line("FAIL", "ray", "not installed", GPU_ENV)
    address = environ.get("RAY_ADDRESS")
    where = (
        f"RAY_ADDRESS={address}: a launch submits a Ray job there"
        if address
        else "no RAY_ADDRESS: a launch starts a local Ray cluster on this node"
    )
    return Line("OK", "ray", f"{have}; {where}")


def disk_line(environ: Mapping[str, str], free: Optional[Callable[[str], int]] = None) -> Line:
    folder = Path(os.path.expanduser(environ.get("CKPTS_DIR") or str(REPO / "ckpts"))).resolve()
    where = next(p for p in (folder, *folder.parents) if p.exists())  # the folder, or the part of it that exists
    left = (free or (lambda p: shutil.disk_usage(p).free))(str(where))
    detail = f"{left / 1e9:.1f} GB free at {where} (CKPTS_DIR={folder}); a recipe's need: give it as an argument"
    return Line(
        "OK" if left >= 100e9 else "WARN",
        "disk",
        detail,
        "" if left >= 100e9 else "a 7B run's checkpoints take hundreds of GB: set CKPTS_DIR to a larger disk",
    )


def _reachable(url: str, timeout: float) -> Optional[str]:
    """None if `url` answers (any HTTP status), else why not; DNS included in the timeout (a thread)."""
    answer: list = ["no answer within %.0f s" % timeout]

    def ask():
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
            answer[0] = None
        except urllib.error.HTTPError:
            answer[0] = None  # the hub answered
        except Exception as e:  # noqa: BLE001 - DNS, refused, proxy, TLS
            answer[0] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout + 1)
    return answer[0]


def hub_lines(environ: Mapping[str, str], reach: Callable[[str, float], Optional[str]] = _reachable) -> list[Line]:
    from huggingface_hub import constants, get_token

    offline = environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes")
    token = "a token is set" if get_token() else "no token (the recipes' models are public)"
    lines = [Line("OK", "hf cache", f"{constants.HF_HUB_CACHE}; {token}")]
    if offline:
        lines.append(
            Line(
                "OK",
                "hf hub",
                "HF_HUB_OFFLINE=1: models (and the flash-attn2 Hub kernel) are read from the cache only",
                "",
            )
        )
        return lines
    why = reach(constants.ENDPOINT, HUB_TIMEOUT_S)
    if why is None:
        lines.append(Line("OK", "hf hub", f"{constants.ENDPOINT} answers"))
    else:
        lines.append(
            Line(
                "WARN",
                "hf hub",
                f"{constants.ENDPOINT} does not answer ({why})",
                "download on a machine with access into a shared HF_HOME (hf download <model>; the Hub "
                "kernel: docs/gpu.md#install), then HF_HUB_OFFLINE=1 on every node",
            )
        )
    return lines


def wandb_line(environ: Mapping[str, str], config=None) -> Line:
    """wandb as the launcher judges it (`wandb_check`); without a recipe, as for the recipes' `[console, wandb]`."""
    local = not environ.get("RAY_ADDRESS")
    env = wandb_check.run_environment(config, environ) if config is not None else dict(environ)
    how = wandb_check.credentials(env, local)
    if how:
        return Line("OK", "wandb", how)
    detail = "no credentials and no offline mode (the recipes log to wandb: a launch is refused)"
    return Line("FAIL", "wandb", detail, "; ".join(wandb_check.FIXES))


def recipe_composed(script: Path, environ: Mapping[str, str]):
    """The composed config a launch of `script` would run: its printed command, composed and finished as the launcher
    does (`rpg.preflight.compose.compose_config`), not validated yet."""
    env = dict(environ, RPG_PRINT_ARGV="1", RPG_DRY_RUN="1")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise ValueError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    argv = json.loads(proc.stdout)["argv"]
    return compose_config(argv[3:])


def recipe_config(script: Path, environ: Mapping[str, str]):
    """The validated config a launch of `script` would run: `recipe_composed`, then validated
    (`rpg.preflight.validation.validate`: the typed config the memory plan and the disk check read)."""
    return validate(recipe_composed(script, environ))


def lora_async_line(config) -> Optional[Line]:
    """WARN for LoRA with the disaggregated asynchronous trainer (separate_async), where verl samples the initial
    policy all run long (verl #7495; `rpg.preflight.lora_rules.separate_async_problem`, which the launcher refuses)."""
    problem = lora_rules.separate_async_problem(config)
    if problem is None:
        return None
    detail, _, fix = problem.partition(" Fix: ")
    return Line("WARN", "lora async", detail, fix)


def recipe_lines(script: Path, environ: Mapping[str, str], node: NodeProbe, said: Sequence[str] = ()) -> list[Line]:
    """The launcher's verdicts on one recipe: memory plan, this node's refusals (those not `said` by the node's lines
    already), checkpoint disk, wandb."""
    name = f"{script.parent.name}/{script.name}"
    warned = []
    try:
        composed = recipe_composed(script, environ)
        warned = [line for line in [lora_async_line(composed)] if line]
        validated = validate(composed)
    except Exception as e:  # noqa: BLE001 - a refused knob, a bad override: the launcher's own message
        fix = f"RPG_DRY_RUN=1 bash {script} shows the whole message"
        return warned + [Line("FAIL", name, f"does not compose: {e}", fix)]
    config, lines = validated.config, []
    if gpu.is_gpu_run(config):
        out = io.StringIO()
        try:
            plan = gpu.check_memory_plan(validated, out=out, node=node)
            status, detail, fix = (
                ("OK", out.getvalue().strip(), "")
                if plan
                else ("WARN", out.getvalue().strip(), "hf download <model> config.json")
            )
        except RecipeConfigError as e:
            status, detail, fix = (
                "FAIL",
                f"{out.getvalue().strip()} {e}".split(" If you measured")[0],
                "the settings it names (or RPG_MEMORY_PLAN=warn after a measured smoke run)",
            )
        lines.append(Line(status, "memory plan", detail.replace("[rpg] ", ""), fix))
        for problem in gpu.runtime_problems(config, node=node) if not environ.get("RAY_ADDRESS") else []:
            detail, _, fix = problem.partition(" Fix: ")
            if detail in said or ("vllm cannot be imported" in detail and "vllm is not installed" in said):
                continue  # the node's line above says it, with the same fix
            lines.append(Line("FAIL", "launch", detail, fix))
    if problem := disk.problem(validated):
        lines.append(Line("FAIL", "ckpt disk", problem))
    if problem := wandb_check.wandb_problem(config, environ):
        detail, _, fix = problem.partition(" Fix, one of: ")
        lines.append(Line("FAIL", "wandb", detail, fix))
    return [Line("OK", name, "composes; the launcher's checks follow")] + lines


def ask_node(find_spec=None) -> NodeProbe:
    """One child process: NVML, torch's CUDA pieces and GPUs, vLLM's ops, flash_attention_2's kernel."""
    find_spec = find_spec or importlib.util.find_spec
    what = ["nvml"] + (["cuda"] if find_spec("torch") else []) + (["vllm"] if find_spec("vllm") else [])
    return gpu_probe.probe(what + gpu.attention_questions(find_spec))


def report(
    recipes: Sequence[Path] = (), environ: Optional[Mapping[str, str]] = None, node: Optional[NodeProbe] = None
) -> list[Line]:
    environ = dict(os.environ if environ is None else environ)
    node = node if node is not None else ask_node()
    torch_cuda = gpu_probe.torch_cuda_version()
    lines = [
        python_line(),
        *package_lines(),
        vllm_line(node),
        attention_line(node),
        *node_lines(node, torch_cuda),
        network_line(environ),
        ray_line(environ),
        disk_line(environ),
        *hub_lines(environ),
        wandb_line(environ),
    ]
    for script in recipes:
        lines += recipe_lines(Path(script), environ, node, said=[line.detail for line in lines])
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="rpg-doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "recipes",
        nargs="*",
        type=Path,
        help="recipe scripts to judge on this node (e.g. recipe/rpg/4b/run_rpg_reinforce_urkl_4k.sh)",
    )
    args = parser.parse_args(argv)
    lines = report(args.recipes)
    print("\n".join(line.text() for line in lines))
    fails = sum(line.status == "FAIL" for line in lines)
    print(
        f"rpg-doctor: {fails} FAIL, {sum(line.status == 'WARN' for line in lines)} WARN, "
        f"{sum(line.status == 'OK' for line in lines)} OK"
    )
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
