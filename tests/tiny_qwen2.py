"""A tiny random Qwen2 checkpoint for in-process engine/rollout tests (shared helper; no download).

Tests get it through the session fixture ``tiny_qwen2_dir`` (tests/conftest.py); spawned processes call
`save_random_qwen2` / `save_word_tokenizer` themselves."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 48


def save_random_qwen2(path: Path | str, max_position_embeddings: int = 128) -> str:
    """Write a 2-layer, hidden-32 Qwen2ForCausalLM with random weights (seed 0), vocab 48, eos 2, pad 0 to `path`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      use_sliding_window=False)  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    return str(path)


def word_tokenizer():
    """A word-level tokenizer over the tiny model's ids: token ``t<i>`` is id i; eos t2, pad t0, unk t3."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")),
                                   eos_token="t2", pad_token="t0", unk_token="t3")  # fmt: skip


def save_word_tokenizer(path: Path | str) -> str:
    """Save `word_tokenizer()` next to a model in `path`."""
    word_tokenizer().save_pretrained(path)
    return str(path)
