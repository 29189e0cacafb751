"""A CPU rollout backend for verl 0.9.1, ``actor_rollout_ref.rollout.name=hf``: token-in/token-out generation with
a plain transformers causal LM, micro-batched, seedable, and fed the actor's weights after every update.

verl 0.9.1 only ships server rollouts for vLLM/SGLang/TRT-LLM (GPU). This module plugs a CPU one in through verl's
own extension points (docs/cpu.md#hf-rollout), nothing else:

* ``verl.workers.rollout.replica.RolloutReplicaRegistry.register("hf", ...)`` -> `HFReplica` (trainer process): starts
  one `HFRolloutServer` Ray actor per replica (``launch_servers``).
* ``verl.workers.rollout.base._ROLLOUT_REGISTRY[("hf", "async")]`` -> `HFServerAdapter` (inside each actor worker):
  receives verl's ``update_weights`` generator of ``(hf_name, tensor)`` after every optimizer step (the colocated
  "naive" checkpoint engine of the sync trainers) and ships a CPU state dict to the server via the Ray object store.
* `HFRolloutServer` (Ray actor): ``generate(prompt_ids, sampling_params, request_id, ...) -> TokenOutput`` with
  ``token_ids`` = response ids (the stop token included, as vLLM), ``log_probs`` = one float per response token.

Semantics (mirrors verl's vLLM server so the trainer cannot tell the difference):

* ``max_tokens``: from the request, else ``min(response_length, prompt_length + response_length - len(prompt))``.
* temperature ``<= 1e-5`` means greedy (argmax). ``top_k <= 0`` and ``top_p >= 1`` disable those filters.
* stop: the model's ``generation_config.eos_token_id`` (int or list) plus any ``stop_token_ids`` in the request;
  ``ignore_eos=True`` disables eos stopping.
* log-probs are verl's default ``logprobs_mode="processed_logprobs"``: ``log_softmax`` of the logits after
  temperature, top-k and top-p (with top-k/top-p off this is exactly what the actor recomputes,
  ``log_softmax(logits / T)``).
* ``n``: verl repeats each prompt ``rollout.n`` times before calling the server, so every request asks for one
  sample; a request with ``n != 1`` is rejected.
* seeding: every request samples with its own ``torch.Generator``, seeded from ``rollout.seed``, the request's own
  ``seed`` (if any), the weight version (``global_steps``), the prompt ids and the occurrence count of that prompt
  under this weight version. Samples are therefore reproducible under a seed and independent of how requests were
  grouped into micro-batches: `decode_batch` pads prompts to ``prompt_length`` tokens and batches to at least
  `MIN_DECODE_ROWS` rows, so a row's logits do not depend on the other rows of its batch (bit-identical with the CPU
  kernels tested; without the padding they differ in the last bits). The n copies of a prompt are interchangeable:
  they receive the same n samples whatever their arrival order, but which copy gets which sample follows arrival
  order, so the CPU sampler (`rpg.cpu.sampler`) orders each group's samples by content.

Micro-batching (docs/cpu.md#hf-rollout): requests that arrive within ``RPG_HF_ROLLOUT_BATCH_WINDOW`` seconds (default
0.02) are left-padded and decoded together (one KV-cached forward per new token for the whole batch), grouped by
(temperature, top_p, top_k); rows stop individually. ``RPG_HF_ROLLOUT_MAX_BATCH`` (default 256) caps a batch and
``RPG_HF_ROLLOUT_THREADS`` (default 1) sets the server's torch threads.

Partial rollouts (the asynchronous v1 trainers, docs/cpu.md#hf-rollout): ``abort_all_requests`` closes the server's
gate and stops the running decode at the next token; each unfinished request returns the tokens it has so far with
``stop_reason="aborted"`` (queued ones with none), tagged with the weight version that generated them, and requests
that arrive while the gate is closed wait for ``resume_generation`` (or, with ``reject_request=True``, return
"aborted" at once), as verl's vLLM server does. verl's ``FullyAsyncLLMServerClient`` then resubmits prompt + partial
response under the new weights, so a response can span several weight versions.

Limits: text only; LoRA only with ``model.lora.merge=True``; policy rollout only (no reward/teacher replicas).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import ray
import torch
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

from rpg.cpu import HF_ROLLOUT
from rpg.shards import full_tensor

__all__ = ["HFReplica", "HFRolloutServer", "HFServerAdapter", "SamplingSpec", "decode_batch", "load_model", "request_seed",
           "server_name"]

logger = logging.getLogger(__name__)
logger.setLevel(os.environ.get("VERL_LOGGING_LEVEL", "INFO"))

ROLLOUT_NAME = HF_ROLLOUT
GREEDY_TEMPERATURE = 1e-5  # vLLM's threshold: below this temperature sampling is greedy


def server_name(replica_rank: int, node_rank: int = 0) -> str:
    """Ray actor name of a replica's server (same scheme as verl's vLLM servers)."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}_{node_rank}"


# ----------------------------------------------------------------------------------------------------------------------
# sampling parameters and the decode loop (pure functions, no Ray)
# ----------------------------------------------------------------------------------------------------------------------
_KNOWN_PARAMS = {"temperature", "top_p", "top_k", "max_tokens", "max_new_tokens", "logprobs", "stop_token_ids",
                 "ignore_eos", "seed", "n", "repetition_penalty"}


@dataclass(frozen=True)
class SamplingSpec:
    """One request's sampling parameters, normalised and validated (see the module docstring for semantics)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    logprobs: bool = False
    stop_token_ids: frozenset = frozenset()
    seed: Optional[int] = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE

    @property
    def group_key(self) -> tuple:
        """Requests with equal keys can share one batched decode."""
        return (self.greedy, self.temperature, self.top_p, self.top_k)

    @classmethod
    def from_request(cls, sampling_params: dict[str, Any], prompt_len: int, prompt_length: int, response_length: int,
                     eos_token_ids: Iterable[int]) -> "SamplingSpec":
        """Build from verl's agent-loop ``sampling_params`` dict. Raises ``ValueError`` naming bad or unknown keys."""
        sp = dict(sampling_params)
        unknown = set(sp) - _KNOWN_PARAMS
        if unknown:
            raise ValueError(f"hf rollout: unsupported sampling params {sorted(unknown)}; "
                             f"supported: {sorted(_KNOWN_PARAMS)}")
        if int(sp.get("n", 1)) != 1:
            raise ValueError(f"hf rollout: n={sp['n']} per request is not supported (verl repeats prompts "
                             f"rollout.n times and sends one request per sample); use n=1")
        if float(sp.get("repetition_penalty", 1.0)) != 1.0:
            raise ValueError(f"hf rollout: repetition_penalty={sp['repetition_penalty']} is not supported; use 1.0")
        max_tokens = sp.get("max_tokens", sp.get("max_new_tokens"))
        if max_tokens is None:
            max_tokens = min(response_length, prompt_length + response_length - prompt_len)
        if int(max_tokens) < 1:
            raise ValueError(f"hf rollout: max_tokens={max_tokens} leaves no room to generate (prompt of "
                             f"{prompt_len} tokens, prompt_length={prompt_length}, response_length={response_length})")
        temperature = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0)
        top_p = float(sp.get("top_p", 1.0) if sp.get("top_p") is not None else 1.0)
        top_k = int(sp.get("top_k", -1) if sp.get("top_k") is not None else -1)
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(f"hf rollout: need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
        stop = set(int(t) for t in (sp.get("stop_token_ids") or ()))
        if not sp.get("ignore_eos", False):
            stop |= set(int(t) for t in eos_token_ids)
        seed = sp.get("seed")
        return cls(max_tokens=int(max_tokens), temperature=temperature, top_p=top_p, top_k=top_k,
                   logprobs=bool(sp.get("logprobs", False)), stop_token_ids=frozenset(stop),
                   seed=None if seed is None else int(seed))


def request_seed(*parts: Any) -> int:
    """A 63-bit seed from any hashable description (stable across processes, unlike ``hash()``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def process_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering, as vLLM's sampler does.

    Args:
        logits: (B, V) float logits of the next token.
    Returns:
        (B, V) processed logits; filtered-out entries are ``-inf``. ``log_softmax`` of this is the
        "processed_logprobs" verl expects from a rollout.
    """
    logits = logits / max(temperature, GREEDY_TEMPERATURE)
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


#: Decode at least this many rows (filler rows are added): CPU GEMM kernels round differently for 1-3 rows than for
#: more, so a request's log-probs (and, at near-ties, its tokens) would depend on how many requests shared its batch.
MIN_DECODE_ROWS = 8


@torch.no_grad()
def decode_batch(model: torch.nn.Module, prompts: list[list[int]], specs: list[SamplingSpec],
                 generators: list[Optional[torch.Generator]], pad_token_id: int,
                 prompt_width: int = 0, stop: Optional[threading.Event] = None) -> list[tuple[list[int], list[float]]]:
    """KV-cached batched decoding of left-padded prompts; each row has its own max length, stop set and generator.

    A row's results do not depend on the other rows when the batch shape does not: prompts are left-padded to
    ``max(prompt_width, longest prompt)`` tokens and the batch to at least `MIN_DECODE_ROWS` rows.

    Args:
        prompts: B lists of prompt token ids (any lengths).
        specs: B `SamplingSpec` sharing one ``group_key`` (temperature/top-k/top-p).
        generators: B per-row generators (ignored when greedy).
        prompt_width: pad prompts to at least this many tokens (the server passes its ``prompt_length``).
        stop: when set (by another thread), decoding ends before the next token; unfinished rows keep what they have.
    Returns:
        B pairs ``(response_ids, log_probs)``; a row ends after its first stop token (included), at ``max_tokens``,
        or, unfinished, when ``stop`` was set.
        ``log_probs`` are processed log-probs of the chosen tokens (empty if the spec did not ask for them).
    """
    spec0 = specs[0]
    assert all(s.group_key == spec0.group_key for s in specs), "decode_batch: mixed sampling groups"
    bsz, plen = len(prompts), max(prompt_width, *(len(p) for p in prompts))
    rows = max(bsz, MIN_DECODE_ROWS)  # rows >= bsz are fillers: one pad token, outputs discarded
    ids = torch.full((rows, plen), pad_token_id, dtype=torch.long)
    mask = torch.zeros((rows, plen), dtype=torch.long)
    mask[bsz:, -1] = 1
    for i, p in enumerate(prompts):
        ids[i, plen - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, plen - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    max_new = max(s.max_tokens for s in specs)
    out_ids: list[list[int]] = [[] for _ in range(bsz)]
    out_lps: list[list[float]] = [[] for _ in range(bsz)]
    active = list(range(bsz))
    cache, step_ids, step_pos = None, ids, positions
    for _ in range(max_new):
        if stop is not None and stop.is_set():
            break
        out = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=cache,
                    use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()
        if spec0.greedy:
            logprobs = torch.log_softmax(logits, dim=-1)
            next_ids = logits.argmax(dim=-1)
        else:
            logprobs = torch.log_softmax(process_logits(logits, spec0.temperature, spec0.top_k, spec0.top_p), -1)
            probs = logprobs.exp()
            next_ids = torch.zeros(rows, dtype=torch.long)
            for i in active:
                next_ids[i] = torch.multinomial(probs[i], 1, generator=generators[i])[0]
        chosen_lp = logprobs.gather(-1, next_ids[:, None])[:, 0]
        still = []
        for i in active:
            tok = int(next_ids[i])
            out_ids[i].append(tok)
            out_lps[i].append(float(chosen_lp[i]))
            if tok not in specs[i].stop_token_ids and len(out_ids[i]) < specs[i].max_tokens:
                still.append(i)
        active = still
        if not active:
            break
        # finished rows keep decoding a pad token (their outputs are no longer recorded)
        step_ids = next_ids.masked_fill(torch.ones(rows, dtype=torch.bool).index_fill(0, torch.tensor(active), False),
                                        pad_token_id)[:, None]
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=-1)
    return [(out_ids[i], out_lps[i] if specs[i].logprobs else []) for i in range(bsz)]


def load_model(path: str, attn_implementation: str = "eager") -> tuple[torch.nn.Module, tuple[int, ...], int]:
    """An fp32 causal LM in eval mode, its stop ids and its pad id (shared by the server and ``rpg-evaluate``).

    Returns:
        ``(model, eos_token_ids, pad_token_id)``: the stop ids are ``generation_config.eos_token_id`` (int or list),
        else ``config.eos_token_id``; the pad id is the generation config's, else the config's, else the first stop id.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)
    model.eval()
    gen_cfg = model.generation_config
    eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else model.config.eos_token_id
    eos_token_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    pad = gen_cfg.pad_token_id if gen_cfg.pad_token_id is not None else model.config.pad_token_id
    return model, eos_token_ids, int(pad if pad is not None else (eos_token_ids or (0,))[0])


# ----------------------------------------------------------------------------------------------------------------------
# the server (a Ray actor in CPU runs; a plain object in unit tests)
# ----------------------------------------------------------------------------------------------------------------------
def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    getter = getattr(cfg, "get", None)
    return getter(key, default) if getter is not None else getattr(cfg, key, default)


class HFRolloutServer:
    """Serves ``generate`` for one replica from an fp32 transformers model on CPU; see the module docstring.

    Args:
        config: verl ``RolloutConfig`` (dataclass or DictConfig): ``prompt_length``, ``response_length``, ``seed``.
        model_config: ``actor_rollout_ref.model`` config: ``local_path``/``path``, optional
            ``override_config.attn_implementation`` (default "eager", the attention the CPU actor uses).
        replica_rank: index of this replica.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0, rollout_mode: Any = None):
        torch.set_num_threads(int(os.environ.get("RPG_HF_ROLLOUT_THREADS", "1")))
        self.config = config
        self.replica_rank = replica_rank
        self.prompt_length = int(_cfg_get(config, "prompt_length"))
        self.response_length = int(_cfg_get(config, "response_length"))
        self.base_seed = int(_cfg_get(config, "seed", 0) or 0)
        path = _cfg_get(model_config, "local_path") or _cfg_get(model_config, "path")
        override = _cfg_get(model_config, "override_config", None) or {}
        attn = _cfg_get(override, "attn_implementation", None) or "eager"
        self.model, self.eos_token_ids, self.pad_token_id = load_model(path, attn)
        self.tied_keys = {k for k in self.model.state_dict() if k == "lm_head.weight"} \
            if getattr(self.model.config, "tie_word_embeddings", False) else set()
        self.global_steps = 0  # an int before the first update (the v1 trainer casts it with int())
        self._occurrences: dict[tuple, int] = {}
        self._pending: list[tuple[list[int], SamplingSpec, torch.Generator, asyncio.Future]] = []
        self._drain_task: Optional[asyncio.Task] = None
        self._lock = asyncio.Lock()  # one decode or weight update at a time
        # partial rollouts: abort_all_requests closes the gate and stops the running decode; resume_generation opens it
        self._stop = threading.Event()  # read by decode_batch in its worker thread
        self._paused = False
        self._rejecting = False
        self._resume = asyncio.Event()
        self._resume.set()
        self._decoding = 0  # requests in the running decode
        self._window = float(os.environ.get("RPG_HF_ROLLOUT_BATCH_WINDOW", "0.02"))
        self._max_batch = int(os.environ.get("RPG_HF_ROLLOUT_MAX_BATCH", "256"))
        self.stats = {"requests": 0, "batches": 0, "tokens": 0, "decode_s": 0.0}
        logger.info("HFRolloutServer[%d] loaded %s (attn=%s, eos=%s)", replica_rank, path, attn, self.eos_token_ids)

    def ready(self) -> bool:
        return True

    # ---- generation ----------------------------------------------------------------------------------------------
    def _generator_for(self, prompt_ids: list[int], spec: SamplingSpec) -> torch.Generator:
        key = (tuple(prompt_ids), spec)
        occurrence = self._occurrences.get(key, 0)
        self._occurrences[key] = occurrence + 1
        gen = torch.Generator()
        gen.manual_seed(request_seed(self.base_seed, spec.seed, self.global_steps, key, occurrence))
        return gen

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       image_data: Optional[list[Any]] = None, video_data: Optional[list[Any]] = None,
                       audio_data: Optional[list[Any]] = None, mm_processor_kwargs: Optional[dict] = None,
                       priority: int = 0, **kwargs) -> TokenOutput:
        """verl's token-in/token-out server call (`LLMServerClient.generate`); returns a `TokenOutput`."""
        if image_data is not None or video_data is not None or audio_data is not None:
            raise ValueError("hf rollout: text only (got image/video/audio data)")
        prompt_ids = [int(t) for t in prompt_ids]
        spec = SamplingSpec.from_request(sampling_params, len(prompt_ids), self.prompt_length, self.response_length,
                                         self.eos_token_ids)
        while self._paused:  # behind a closed gate (abort_all_requests): wait for resume_generation, or fail now
            if self._rejecting:
                return TokenOutput(token_ids=[], log_probs=[] if spec.logprobs else None, stop_reason="aborted",
                                   num_preempted=0, extra_fields={"global_steps": self.global_steps})
            await self._resume.wait()
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt_ids, spec, self._generator_for(prompt_ids, spec), future))
        if self._drain_task is None or self._drain_task.done():
            self._drain_task = asyncio.ensure_future(self._drain())
        token_ids, log_probs, stop_reason, version = await future
        return TokenOutput(token_ids=token_ids, log_probs=log_probs if spec.logprobs else None,
                           stop_reason=stop_reason, num_preempted=0, extra_fields={"global_steps": version})

    def _aborted(self, item) -> None:
        """Answer a request that never reached a decode: no tokens, "aborted" (the client resubmits it)."""
        if not item[3].done():
            item[3].set_result(([], [], "aborted", self.global_steps))

    async def _drain(self) -> None:
        """Serve pending requests in micro-batches until the queue stays empty for one batching window."""
        await asyncio.sleep(self._window)
        while self._pending:
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch:]
            groups: dict[tuple, list] = {}
            for item in batch:
                groups.setdefault(item[1].group_key, []).append(item)
            for items in groups.values():
                await self._run_group(items)
            if not self._pending:
                await asyncio.sleep(self._window)  # let stragglers of the same wave join the next batch

    async def _run_group(self, items: list) -> None:
        async with self._lock:
            if self._paused:  # the gate closed while this group waited for the lock
                for it in items:
                    self._aborted(it)
                return
            version = self.global_steps  # the weights every token of this decode comes from
            t0 = time.perf_counter()
            self._decoding = len(items)
            try:
                results = await asyncio.to_thread(decode_batch, self.model, [it[0] for it in items],
                                                  [it[1] for it in items], [it[2] for it in items], self.pad_token_id,
                                                  self.prompt_length, self._stop)
            except Exception as exc:  # fail these requests, keep serving
                logger.exception("HFRolloutServer: decode failed")
                for it in items:
                    if not it[3].done():
                        it[3].set_exception(exc)
                return
            finally:
                self._decoding = 0
            stopped = self._stop.is_set()
            self.stats["requests"] += len(items)
            self.stats["batches"] += 1
            self.stats["tokens"] += sum(len(r[0]) for r in results)
            self.stats["decode_s"] += time.perf_counter() - t0
        for it, (ids, lps) in zip(items, results):
            spec = it[1]
            finished = len(ids) >= spec.max_tokens or (ids and ids[-1] in spec.stop_token_ids)
            if not it[3].done():
                it[3].set_result((ids, lps, "completed" if finished or not stopped else "aborted", version))

    # ---- weights ---------------------------------------------------------------------------------------------------
    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: Optional[int] = None) -> dict:
        """Load the actor's full (HF-named) weights. Unknown or missing names raise (a silent partial load would
        make the rollout sample a stale policy)."""
        async with self._lock:
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
            missing = set(missing) - self.tied_keys
            if missing or unexpected:
                raise ValueError(f"hf rollout: weight names do not match the model: missing={sorted(missing)} "
                                 f"unexpected={sorted(unexpected)}")
            if global_steps is not None:
                self.global_steps = int(global_steps)
            self._occurrences.clear()
            stats, self.stats = self.stats, {"requests": 0, "batches": 0, "tokens": 0, "decode_s": 0.0}
        logger.info("HFRolloutServer[%d] weights <- step %s (%d tensors); since last update: %s", self.replica_rank,
                    global_steps, len(state_dict), stats)
        return stats

    async def get_state_checksum(self) -> float:
        """Sum of |params| (a cheap fingerprint used by tests/diagnostics)."""
        return float(sum(p.detach().double().abs().sum() for p in self.model.parameters()))

    # ---- lifecycle hooks verl calls on a replica (no device memory to manage on CPU) ------------------------------
    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """Close the gate and end every unfinished request (partial rollout; see the module docstring).

        Queued requests return "aborted" with no tokens, the running decode stops before its next token and returns
        what it has. Returns once nothing is decoding, so a weight update that follows cannot mix versions. New
        requests wait for `resume_generation` (``reject_request=True``: return "aborted" at once).
        """
        self._paused, self._rejecting = True, bool(reject_request)
        self._resume.clear()
        self._stop.set()
        running = self._decoding
        queued, self._pending = self._pending, []
        for item in queued:
            self._aborted(item)
        async with self._lock:  # the running decode (if any) has returned
            self._stop.clear()
        logger.info("HFRolloutServer[%d] aborted %d queued and %d running requests", self.replica_rank, len(queued),
                    running)
        return {"aborted_count": len(queued) + running, "request_ids": []}

    async def resume_generation(self) -> None:
        """Open the gate closed by `abort_all_requests`: waiting requests are admitted."""
        self._paused = self._rejecting = False
        self._resume.set()

    async def start_profile(self, **kwargs) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


# ----------------------------------------------------------------------------------------------------------------------
# verl glue: replica (trainer side) and server adapter (actor-worker side)
# ----------------------------------------------------------------------------------------------------------------------
class HFReplica(RolloutReplica):
    """Trainer-side handle of one replica: launches its `HFRolloutServer` actor (0 CPUs reserved, 1 process)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        if self.is_reward_model or self.is_teacher_model:
            raise NotImplementedError("hf rollout: only the policy rollout is supported (no reward/teacher replicas)")
        name = server_name(self.replica_rank)
        server = (ray.remote(HFRolloutServer)
                  .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
                  .remote(self.config, self.model_config, self.replica_rank, self.rollout_mode))
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # only a key for verl's load balancer; there is no HTTP endpoint


class HFServerAdapter(BaseRollout):
    """Actor-worker side: forwards verl's weight sync to this replica's server (rank 0 of the replica ships)."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        size = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // size if replica_rank == -1 else replica_rank
        self.is_leader = rank % size == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        if self.is_leader:
            await self._server_handle().wake_up.remote(tags=tags)

    async def release(self) -> None:
        if self.is_leader:
            await self._server_handle().sleep.remote()

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: Optional[int] = None,
                             peft_config: Any = None, **kwargs) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"hf rollout: wire_format={wire_format!r} is not supported; use 'named_tensors' "
                             f"(actor_rollout_ref.rollout.checkpoint_engine.backend=naive)")
        if peft_config is not None:
            raise ValueError("hf rollout: LoRA adapters are not supported; set actor_rollout_ref.model.lora.merge=True")
        state_dict = {}
        for name, tensor in weights:  # every rank drains: DTensor.full_tensor() is a collective
            state_dict[name] = full_tensor(tensor).detach().to("cpu", dtype=torch.float32, copy=True)
        if self.is_leader:
            await self._server_handle().update_weights.remote(state_dict, global_steps)


# ---- registration: runs in every process that imports this module (VERL_USE_EXTERNAL_MODULES) ------------------------
_ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HFServerAdapter"
RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: HFReplica)
