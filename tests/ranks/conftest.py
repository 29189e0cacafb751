"""Fixtures of the multi-rank tests: one pool of 2 gloo ranks shared by the whole session, and the tiny model."""

import pytest


@pytest.fixture(scope="session")
def two_ranks():
    """2 spawned processes in one gloo process group (tests/ranks/rank_pool.py); closed at the end of the session."""
    pytest.importorskip("verl.workers.engine_workers")
    from rank_pool import RankPool

    pool = RankPool(world_size=2)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def tiny_model_with_tokenizer(tmp_path_factory) -> str:
    """The tiny random Qwen2 of tests/tiny_qwen2.py plus a word-level tokenizer over its 48 ids (the fused worker's
    rollout side loads one)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from tiny_qwen2 import save_random_qwen2

    model_dir = save_random_qwen2(tmp_path_factory.mktemp("tiny_qwen2_ranks"))
    vocab = {f"t{i}": i for i in range(48)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")), eos_token="t2",
                            pad_token="t0", unk_token="t3").save_pretrained(model_dir)  # fmt: skip
    return model_dir
