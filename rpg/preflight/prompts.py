"""Prompt lengths before launch: every prompt of the local data files, rendered with the model's chat template as
verl's dataset renders it, must fit `data.max_prompt_length`.

Without this check a longer prompt is cut silently (`data.truncation=left|right|middle`: the recipes keep the end of
a prompt, the question; a chat template's first tokens are lost) or fails in a worker minutes later
(`truncation=error`). With `data.filter_overlong_prompts=True` verl drops such prompts itself, which is allowed here.
Checked when the model's tokenizer is on this machine (a local folder, or the Hugging Face cache) and the data files
are local parquet files (otherwise the dry-run summary says it was not checked; a file this check cannot render, e.g.
without the prompt column, is left to verl's dataset); a file's lengths are computed once per process.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from rpg.preflight.inputs import _knob, _local_files, _paths

PROMPT_LEN_KEY = "data.max_prompt_length"


@functools.lru_cache(maxsize=32)
def _tokenizer(model: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    # local files only: a hub model is checked when its tokenizer was downloaded (no network access from a check)
    return AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code, local_files_only=True)


@functools.lru_cache(maxsize=64)
def prompt_lengths(file: str, stamp: tuple, model: str, trust: bool, prompt_key: str, kwargs: tuple) -> list[int]:
    """Token counts of the prompts of a parquet file as verl's `RLHFDataset` counts them (the chat template with
    `add_generation_prompt=True` and `data.apply_chat_template_kwargs`, no extra special tokens). `stamp` (size,
    mtime) invalidates the cache when the file changes."""
    import pyarrow.parquet as pq

    tokenizer = _tokenizer(model, trust)
    rows = pq.read_table(file, columns=[prompt_key]).column(0).to_pylist()
    texts = [tokenizer.apply_chat_template(r, add_generation_prompt=True, tokenize=False, **dict(kwargs)) for r in rows]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def _setting(config: DictConfig) -> tuple[str, bool, str, tuple]:
    model = config.actor_rollout_ref.model
    kwargs = OmegaConf.to_container(config.data.get("apply_chat_template_kwargs", None) or OmegaConf.create())
    return str(model.path), bool(model.get("trust_remote_code", False)), str(config.data.prompt_key), tuple(
        sorted(kwargs.items())
    )


def unchecked_reason(config: DictConfig) -> Optional[str]:
    """Why the prompt lengths cannot be checked here (None: they can): the model is neither a local folder nor a hub
    model whose tokenizer is in the local Hugging Face cache."""
    model, trust, _, _ = _setting(config)
    try:
        tokenizer = _tokenizer(model, trust)
    except Exception:  # noqa: BLE001 -- not downloaded, not a repo id, no network: a launch downloads it
        return f"the tokenizer of {model} is not on this machine"
    if tokenizer.chat_template is None:
        return f"the tokenizer of {model} has no chat template"
    return None


def prompt_length_problems(config: DictConfig) -> list[str]:
    """One line per local data file that holds a prompt longer than `data.max_prompt_length`, naming both lengths,
    the settings and the fix; empty when every prompt fits, verl filters them, or the check cannot run here."""
    if unchecked_reason(config) is not None or config.data.get("filter_overlong_prompts", False):
        return []
    limit = int(config.data.max_prompt_length)
    model, trust, prompt_key, kwargs = _setting(config)
    truncation = config.data.get("truncation", "error")
    effect = "fail in the data loader, minutes after the launch" if truncation == "error" else "be cut silently"
    problems = []
    for key in ("data.train_files", "data.val_files"):
        for path in _paths(config, key):
            for file in _local_files(path) or []:
                if not (file.endswith(".parquet") and os.path.isfile(file)):
                    continue
                st = os.stat(file)
                try:
                    lengths = prompt_lengths(file, (st.st_size, st.st_mtime_ns), model, trust, prompt_key, kwargs)
                except Exception:  # noqa: BLE001 -- no prompt column, not chat messages: verl's dataset reports it
                    continue
                over = [n for n in lengths if n > limit]
                if over:
                    problems.append(
                        f"{key}{_knob(key)}: {file}: {len(over)} of {len(lengths)} prompts are longer than "
                        f"{PROMPT_LEN_KEY}={limit}{_knob(PROMPT_LEN_KEY)} tokens with the chat template of {model} "
                        f"(the longest: {max(over)} tokens); with data.truncation={truncation} they would {effect}. "
                        f"Fix: {PROMPT_LEN_KEY}={max(over)} or more, or data.filter_overlong_prompts=True to drop them"
                    )
    return problems
