"""A tiny random Qwen2 checkpoint for in-process engine/rollout tests (shared helper; no tokenizer, no download)."""

from __future__ import annotations

from pathlib import Path

import torch


def save_random_qwen2(path: Path | str, max_position_embeddings: int = 128) -> str:
    """Write a 2-layer, hidden-32 Qwen2ForCausalLM with random weights (seed 0), vocab 48, eos 2, pad 0 to `path`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      use_sliding_window=False)  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    return str(path)
