"""Shared fixtures for the CPU-backend tests: a tiny random Qwen2 checkpoint on disk (no tokenizer needed)."""

import pytest
from tiny_qwen2 import save_random_qwen2


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    """A 2-layer, hidden-32 Qwen2ForCausalLM with random weights (seed 0), vocab 48, eos 2, pad 0."""
    return save_random_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))
