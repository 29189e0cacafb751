"""Shared fixtures for the data/reward/report tests: the tool modules, a tiny tokenizer."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prepare_data():
    from rpg.tools import prepare_data

    return prepare_data


@pytest.fixture(scope="session")
def report():
    from rpg.tools import report

    return report


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """Byte-level tokenizer (256 byte tokens + chatml specials), built offline in milliseconds.

    With no merges every byte is one token, so token counts are exact: ``len(encode(s)) == len(s.encode())``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=259, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tk.train_from_iterator(["Answer: 0"], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML,
        padding_side="left", additional_special_tokens=["<|im_start|>"],
    )
