"""Per-GPU memory plan of a colocated verl 0.9.1 run (FSDP actor + vLLM rollout on the same GPUs), before any GPU
is touched (docs/gpu.md#memory-plan).

verl 0.9.1 colocates, on every GPU, the actor's FSDP shards, a vLLM worker and (when a KL loss or a KL-in-reward
needs one) a reference model. A training step has two phases whose peaks are estimated separately:

* **rollout**: vLLM is awake. vLLM 0.24 sizes its pool as ``gpu_memory_utilization × the GPU's TOTAL memory``
  (``requested_memory = total_memory × gpu_memory_utilization`` in its GPU worker; the KV cache is what is left of
  that after its weights and profiled activations), and refuses to start when less than that is free. That total is
  ``torch.cuda.mem_get_info()``'s, less than NVML's (the budget) by ``cuda_hidden_gib``: 480 MiB on an H100 80GB,
  615 MiB on an H200 (measured, issue 33); every phase is planned within what CUDA sees. verl passes
  ``actor_rollout_ref.rollout.gpu_memory_utilization`` unchanged (``vllm_async_server.py``). Next to that pool the
  trainer process keeps, during the whole rollout: its CUDA context and NCCL buffers, the actor's parameter shards
  (``model_dtype`` fp32) unless ``fsdp_config.param_offload`` (verl offloads them after the weight sync), and the
  optimizer states unless ``fsdp_config.optimizer_offload`` (offloaded on leaving ``train_mode``). The optimizer
  states are created lazily by the first ``optimizer.step()``, so the tightest moment is the KV-cache resume of the
  *second* step. Gradients are freed (``zero_grad`` on leaving ``train_mode``). The weight sync moment (vLLM weights
  resumed, a ``update_weights_bucket_megabytes`` bucket, the KV cache not yet) is estimated too. vLLM's sampler
  (``sampler_gib``: log-probs of up to ``max_num_seqs`` rows over the vocabulary) is profiled by vLLM at start-up in
  verl's ``processed_logprobs`` mode, so it shrinks the KV cache inside the pool; in a ``raw_*`` mode its unprofiled
  log-probs tensor is a rollout term of its own.
* **update**: vLLM sleeps (level 2 with vLLM ≥ 0.18: weights and KV cache discarded; with
  ``free_cache_engine=False`` it keeps its whole pool). The trainer holds fp32 parameter, gradient and optimizer
  shards (the optimizer is loaded back onto the GPU for the update even with ``optimizer_offload``), the bf16
  unsharded FSDP units being computed (the root unit: embeddings, final norm, lm_head; one decoder layer plus a
  prefetched one), and the activations of one micro-batch of ``ppo_max_token_len_per_gpu`` tokens: the layer inputs
  kept by gradient checkpointing, one layer's recomputed activations and their gradients, and the bf16 logits
  ``tokens × vocab`` (flash-attn's cross-entropy kernel writes their gradient in place; without the ``flash_attn``
  package verl takes torch's log-softmax path, which holds ``TORCH_CE_FP32_COPIES`` more fp32 ``tokens × vocab``
  tensors at this moment: measured on an H200). Three moments are taken:
  the logits/backward moment, the end of the backward (the root unit's gradient cast to fp32 for the
  reduce-scatter), and the optimizer step (torch's foreach AdamW allocates one more fp32 shard). The log-prob
  forward (old and reference log-probs) is a fourth, smaller moment. The reference model costs no resident GPU
  memory: verl forces CPU offload on forward-only engines (``CPUOffload``/``CPUOffloadPolicy``).

Ignored (each one can move a number by up to about a GiB; the constants below are estimates unless marked measured):
allocator fragmentation (``HEADROOM_GIB``: verl switches the trainer's allocator to ``expandable_segments:True``
after each weight sync, verl/workers/engine_workers.py:827, so the update phase runs with it; an H200 probe measured
1.5–18.7 GiB reserved above the allocated peak without it, 11.3 GiB with it at 55 GiB allocated, and the allocator
returns cached blocks before it raises an out-of-memory error, so the plan counts allocated bytes), Ulysses
sequence parallelism (activations are taken
as if ``ulysses_sequence_parallel_size == 1``), LoRA's activations (a LoRA run's other terms are counted:
`lora_terms`, docs/gpu.md#lora), activation offload, ``use_remove_padding=False`` padding,
vision towers, MoE, torch.compile's workspaces, vLLM's CUDA-graph pool beyond ``VLLM_SLEEP_REMAINDER_GIB``,
processes other than verl's on the GPU, and the critic (RPG and the baselines have none).

This module is the arithmetic: the model's shape (``ModelShape``, from a config.json, the Hugging Face cache or the
shipped table), the run's numbers (``Settings``) and the plan (``estimate``); pure numbers, nothing beyond the
standard library. ``rpg.preflight.memory_config`` reads a validated run's ``Settings`` and budget and makes its plan.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional

from rpg import modes

GIB = float(1 << 30)
DEFAULT_BUDGET_GIB = 80.0
MODEL_TABLE = Path(__file__).with_name("model_configs.json")

# Estimated constants (GiB per GPU), none measured on a GPU yet (docs/gpu.md#unconfirmed).
CUDA_CONTEXT_GIB = 0.6  # one CUDA context + cuBLAS/cuDNN workspaces per process (the trainer, the vLLM worker)
NCCL_GIB = 0.5  # NCCL communicator buffers of the trainer's process groups
VLLM_SLEEP_REMAINDER_GIB = 1.0  # what a sleeping vLLM keeps besides its context: CUDA graphs, non-cumem buffers
HEADROOM_GIB = 2.0  # allocator fragmentation and small buffers: a phase must fit in budget - headroom
# Measured on one GPU (issue 33; docs/gpu.md#checking-the-plan-on-one-gpu)
TOPK_SUPPORT_BYTES = 8  # per token and support entry: int32 id + fp32 log-prob (rpg.topk_kl.Support)
TOPK_CHUNK_TOKENS = 1024  # rows of the top-k KL's chunked log-sum-exp (rpg.topk_kl.DEFAULT_CHUNK_TOKENS)
TOPK_BACKWARD_FP32_CHUNKS = 2  # fp32 (chunk, V) tensors its backward holds at once (docs/benchmarks.md#topk-kl-gpu)
TORCH_CE_FP32_COPIES = 1  # fp32 tokens × vocab tensors torch's cross-entropy path adds at the logits moment (H200)
CUDA_HIDDEN_MIB = ((81_559, 480), (143_771, 615))  # (NVML total, NVML − mem_get_info total) MiB: H100, H200


def cuda_hidden_gib(budget_gib: float) -> float:
    """NVML's total less the total CUDA reports (vLLM's basis), for a GPU of `budget_gib` (NVML's, GiB): the measured
    value of the GPU within 2 % of that size, else the largest measured (unverified for other GPUs)."""
    for total_mib, hidden_mib in CUDA_HIDDEN_MIB:
        if abs(budget_gib * 1024 / total_mib - 1) <= 0.02:
            return hidden_mib / 1024
    return max(h for _, h in CUDA_HIDDEN_MIB) / 1024

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
#: peft's ``all-linear`` on a Qwen2/Qwen3 decoder: every linear layer of each decoder layer (not lm_head)
LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_modules(target_modules: Any) -> tuple[str, ...]:
    """The linear layers a LoRA ``target_modules`` adapts: ``all-linear`` (peft's: every linear layer but the output
    layer), or names peft matches by suffix (``q_proj``, ``model.layers.0.mlp.up_proj`` counts as every ``up_proj``).
    ValueError naming actor_rollout_ref.model.target_modules for a name the plan does not know."""
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules or [])
    if names == ["all-linear"]:
        return LORA_ALL_LINEAR
    picked = {m for name in names for m in LORA_ALL_LINEAR if str(name).split(".")[-1] == m}
    unknown = [n for n in names if str(n).split(".")[-1] not in LORA_ALL_LINEAR]
    if unknown or not picked:
        raise ValueError(f"GPU memory plan: actor_rollout_ref.model.target_modules={target_modules!r}: the plan knows "
                         f"all-linear and the linear layers {', '.join(LORA_ALL_LINEAR)}; not {unknown or names}")
    return tuple(m for m in LORA_ALL_LINEAR if m in picked)


@dataclass(frozen=True)
class ModelShape:
    """The shape fields of a decoder-only HF config (Qwen2/Qwen3 family) the plan needs."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    max_position_embeddings: int = 0

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.hd

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2"  # Qwen2 has q/k/v biases; Qwen3 has none but q/k RMSNorms

    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, SwiGLU MLP, two RMSNorms; Qwen3: q/k norms)."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        if self.model_type == "qwen3":
            attn += 2 * self.hd
        return attn + 3 * h * i + 2 * h

    def root_params(self) -> int:
        """Parameters outside the decoder layers: embeddings, final norm, lm_head (absent when tied)."""
        emb = self.vocab_size * self.hidden_size
        return emb * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    def param_count(self) -> int:
        return self.num_hidden_layers * self.layer_params() + self.root_params()

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a decoder layer, by its Hugging Face name."""
        h, i = self.hidden_size, self.intermediate_size
        return {"q_proj": (h, self.q_dim), "k_proj": (h, self.kv_dim), "v_proj": (h, self.kv_dim),
                "o_proj": (self.q_dim, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def lora_layer_params(self, rank: int, modules: tuple[str, ...]) -> int:
        """LoRA parameters of one decoder layer: rank·(in + out) per adapted linear layer (A: rank × in, B: out ×
        rank; peft adds no bias)."""
        dims = self.linear_dims()
        return sum(rank * (dims[name][0] + dims[name][1]) for name in modules)

    def lora_params(self, rank: int, modules: tuple[str, ...]) -> int:
        """LoRA parameters of the model (every decoder layer; embeddings and lm_head are not adapted)."""
        return self.num_hidden_layers * self.lora_layer_params(rank, modules)

    def vllm_lora_bytes(self, max_lora_rank: int, tp: int = 1, dtype_bytes: int = 2) -> float:
        """Per GPU, vLLM's preallocated LoRA weights for one adapter slot (verl's max_loras=1) of `max_lora_rank`:
        vLLM wraps every linear layer of each decoder layer whatever the adapter targets; a column-parallel layer
        (q, k, v, gate, up) keeps A (rank × in) whole and B (out × rank) split over TP, a row-parallel one (o, down)
        A split and B whole; in the model's dtype."""
        total = 0.0
        for name, (fan_in, fan_out) in self.linear_dims().items():
            row_parallel = name in ("o_proj", "down_proj")
            total += max_lora_rank * (fan_in / tp + fan_out if row_parallel else fan_in + fan_out / tp)
        return self.num_hidden_layers * total * dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1, dtype_bytes: int = 2) -> float:
        """vLLM KV cache per token per GPU: K and V of every layer, KV heads split over TP (replicated below 1)."""
        kv_heads = max(self.num_key_value_heads / tp, 1.0)
        return 2 * self.num_hidden_layers * kv_heads * self.hd * dtype_bytes

    @classmethod
    def from_dict(cls, name: str, cfg: dict) -> "ModelShape":
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size") if k not in cfg]
        if missing:
            raise ValueError(f"model config of {name!r} lacks {missing}; the memory plan needs a decoder-only HF "
                             "config")
        return cls(
            name=name,
            model_type=str(cfg.get("model_type", "qwen2")),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=int(cfg["num_attention_heads"]),
            num_key_value_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            head_dim=int(cfg.get("head_dim") or 0),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 0),
        )


@dataclass(frozen=True)
class Settings:
    """The run settings the plan depends on (numbers only; `settings_from_config` reads them from a verl config)."""

    n_gpus: int = 8  # FSDP shards over every rank (fsdp_size -1)
    update_tokens: int = 4096  # tokens of one update micro-batch on one GPU
    infer_tokens: int = 4096  # tokens of one log-prob micro-batch (old / reference log-probs)
    gpu_memory_utilization: float = 0.85
    rollout_tp: int = 1
    free_cache_engine: bool = True
    param_offload: bool = False
    optimizer_offload: bool = False
    param_bytes: int = 4  # fsdp_config.model_dtype (fp32 master weights)
    compute_bytes: int = 2  # mixed precision param_dtype (bf16)
    reduce_bytes: int = 4  # mixed precision reduce_dtype (fp32)
    optimizer: str = "AdamW"
    optimizer_states: int = 2  # fp32 tensors per parameter (AdamW: exp_avg, exp_avg_sq; schedule-free: z, exp_avg_sq)
    foreach_step: bool = True  # torch.optim foreach step: one more fp32 shard while stepping
    flash_ce: bool = True  # flash-attn's in-place cross-entropy (the flash_attn package); False: torch's path
    accumulated_grads: bool = True  # gradient shards exist during a backward (every micro-batch after a
    # mini-batch's first: verl accumulates); False: a lone micro-batch after zero_grad(set_to_none), as the probe
    gradient_checkpointing: bool = True
    fused_kernels: bool = False  # use_fused_kernels: logits never materialised in full
    entropy: bool = False  # entropy computed from the logits (entropy_coeff != 0 or calculate_entropy)
    reference: bool = False  # verl builds a reference model (need_reference_policy)
    weight_bucket_mib: int = 2048  # rollout.checkpoint_engine.update_weights_bucket_megabytes
    strategy: str = "fsdp"
    max_num_seqs: int = 1024  # rollout.max_num_seqs: rows vLLM samples in one decode step (at most)
    max_num_batched_tokens: int = 8192  # rollout.max_num_batched_tokens: bounds those rows too
    logprobs_mode: str = "processed_logprobs"  # rollout.logprobs_mode (verl 0.9.1's default)
    topk: int = 0  # k of the top-k KL's support (policy_loss.kl_estimator=topk); 0: the sampled estimator
    lora_rank: int = 0  # LoRA rank (actor_rollout_ref.model.lora_rank / lora.rank); 0: full-weight training
    lora_modules: tuple[str, ...] = ()  # the adapted linear layers (`lora_modules` of target_modules)
    vllm_lora_rank: int = 0  # vLLM's max_lora_rank verl derives (0: no adapter in vLLM: merged, or no LoRA)
    lora_reference_copies: int = 0  # fp32 copies of the adapter the reference keeps (periodic: its snapshot)

    def replace(self, **kw: Any) -> "Settings":
        return dataclasses.replace(self, **kw)


@dataclass
class MemoryPlan:
    """Per-GPU peaks (GiB) of the rollout and update phases with their terms (docs/gpu.md#memory-plan)."""

    model: str
    budget_gib: float
    settings: Settings
    shape: ModelShape
    rollout: dict = field(default_factory=dict)  # term -> GiB, at the phase's peak moment
    update: dict = field(default_factory=dict)
    moments: dict = field(default_factory=dict)  # moment name -> GiB (every moment estimated)
    startup_free_needed_gib: float = 0.0  # what vLLM needs free at start-up (fraction × total)
    startup_trainer_gib: float = 0.0  # what the trainer holds when vLLM starts
    kv_cache_gib: float = 0.0
    sampler_gib: float = 0.0  # vLLM's sampler peak (inside the pool unless counted as a rollout term)
    headroom_gib: float = HEADROOM_GIB
    cuda_hidden_gib: float = 0.0  # NVML's total less CUDA's (`cuda_hidden_gib`)
    lora: dict = field(default_factory=dict)  # LoRA runs: term -> GiB per GPU (`lora_terms`); empty otherwise
    lora_params: int = 0  # the adapter's parameter count

    @property
    def visible_gib(self) -> float:
        """The GPU's total as CUDA (and vLLM) see it."""
        return self.budget_gib - self.cuda_hidden_gib

    @property
    def rollout_gib(self) -> float:
        return sum(self.rollout.values())

    @property
    def update_gib(self) -> float:
        return sum(self.update.values())

    @property
    def kv_cache_tokens(self) -> int:
        per_token = self.shape.kv_bytes_per_token(self.settings.rollout_tp)
        return int(max(self.kv_cache_gib, 0.0) * GIB // per_token)

    def line(self) -> str:
        return (f"[rpg] GPU memory plan (per GPU, {self.model}, budget {self.budget_gib:.1f} GiB): "
                f"rollout {self.rollout_gib:.1f} GiB, update {self.update_gib:.1f} GiB")

    def breakdown(self) -> str:
        rows = [self.line()]
        for phase, terms in (("rollout", self.rollout), ("update", self.update)):
            rows.append(f"  {phase}: " + ", ".join(f"{k} {v:.2f}" for k, v in terms.items() if v))
        rows.append("  moments: " + ", ".join(f"{k} {v:.1f}" for k, v in self.moments.items()))
        rows.append(f"  vLLM KV cache ~{self.kv_cache_gib:.1f} GiB (~{self.kv_cache_tokens:,} tokens per GPU), after "
                    f"its sampler peak ~{self.sampler_gib:.2f} GiB")
        return "\n".join(rows)

    @property
    def limit_gib(self) -> float:
        return self.visible_gib - self.headroom_gib

    def max_gpu_memory_utilization(self) -> float:
        """The largest fraction (a multiple of 0.05) whose rollout and start-up fit in CUDA's total - headroom."""
        pool = self.settings.gpu_memory_utilization * self.visible_gib
        others = self.rollout_gib - pool
        frac = (self.limit_gib - others) / self.visible_gib
        frac = min(frac, (self.visible_gib - self.startup_trainer_gib) / self.visible_gib)
        return math.floor(frac * 20 + 1e-9) / 20

    def over_limit(self) -> str:
        """The limit a phase is over, in words: CUDA's total less the headroom."""
        return (f"{self.visible_gib:.1f} GiB CUDA sees less {self.headroom_gib:.1f} GiB headroom "
                f"({self.limit_gib:.1f} GiB)")

    def problems(self) -> list[str]:
        """Errors for every phase over budget - headroom, each naming the numbers and the settings that fit."""
        s, out = self.settings, []
        if self.rollout_gib > self.limit_gib:
            frac = self.max_gpu_memory_utilization()
            resident = {k: v for k, v in self.rollout.items() if k in ("actor params", "optimizer states")}
            others = self.rollout_gib - s.gpu_memory_utilization * self.visible_gib
            fixes = [f"lower actor_rollout_ref.rollout.gpu_memory_utilization from {s.gpu_memory_utilization:g} to "
                     f"{frac:.2f} or below (vLLM's pool is that fraction of the GPU's total memory)"]
            if "optimizer states" in resident:
                fixes.append(f"set actor_rollout_ref.actor.fsdp_config.optimizer_offload=True "
                             f"(-{resident['optimizer states']:.1f} GiB during rollout)")
            if "actor params" in resident:
                fixes.append(f"set actor_rollout_ref.actor.fsdp_config.param_offload=True "
                             f"(-{resident['actor params']:.1f} GiB during rollout)")
            if s.rollout_tp == 1:
                fixes.append("with a lower fraction, actor_rollout_ref.rollout.tensor_model_parallel_size=2 halves "
                             "vLLM's weights per GPU so more of the pool is KV cache")
            outside = ", ".join(f"{k} {v:.1f}" for k, v in self.rollout.items() if not k.startswith("vLLM pool") and v)
            out.append(
                f"GPU memory plan: the rollout phase needs about {self.rollout_gib:.1f} GiB per GPU, over the "
                f"{self.over_limit()}: vLLM {s.gpu_memory_utilization:g} × {self.visible_gib:.1f} GiB = "
                f"{s.gpu_memory_utilization * self.visible_gib:.1f} GiB plus {others:.1f} GiB outside vLLM's pool "
                f"({outside}); the first OOM would come at the KV-cache resume of step 2 (optimizer states exist after "
                f"step 1). To fit: " + "; or ".join(fixes) + ".")
        if self.update_gib > self.limit_gib:
            tokens = self.max_update_tokens()
            fixes = []
            if tokens >= 1:
                fixes.append(f"lower actor_rollout_ref.actor.ppo_max_token_len_per_gpu (now {s.update_tokens}) to "
                             f"{tokens} or below (it must stay >= max_prompt_length + max_response_length)")
            if not s.gradient_checkpointing:
                fixes.append("set actor_rollout_ref.model.enable_gradient_checkpointing=True")
            if not s.fused_kernels:
                fixes.append("set actor_rollout_ref.model.use_fused_kernels=True (logits never materialised in full)")
            if not s.free_cache_engine:
                fixes.append("set actor_rollout_ref.rollout.free_cache_engine=True (vLLM sleeps during the update)")
            fixes.append(f"use more GPUs (trainer.n_gpus_per_node × trainer.nnodes, now {s.n_gpus}: the fp32 "
                         f"parameter, gradient and optimizer shards shrink with it)")
            terms = ", ".join(f"{k} {v:.1f}" for k, v in self.update.items() if v)
            out.append(f"GPU memory plan: the update phase needs about {self.update_gib:.1f} GiB per GPU, over the "
                       f"{self.over_limit()}: {terms}. To fit: " + "; or ".join(fixes) + ".")
        if self.startup_free_needed_gib > self.visible_gib - self.startup_trainer_gib:
            out.append(
                f"GPU memory plan: vLLM needs {self.startup_free_needed_gib:.1f} GiB free at start-up "
                f"({s.gpu_memory_utilization:g} × {self.visible_gib:.1f} GiB) but the trainer already holds "
                f"{self.startup_trainer_gib:.1f} GiB; lower actor_rollout_ref.rollout.gpu_memory_utilization to "
                f"{self.max_gpu_memory_utilization():.2f} or below.")
        return out

    def max_update_tokens(self) -> int:
        """The largest micro-batch token budget whose update phase fits (0 when none does)."""
        lo, hi = 0, max(self.settings.update_tokens, 1)
        if estimate(self.shape, self.settings.replace(update_tokens=1), self.budget_gib).update_gib > self.limit_gib:
            return 0
        while hi > lo + 1:
            mid = (lo + hi) // 2
            fits = estimate(self.shape, self.settings.replace(update_tokens=mid), self.budget_gib).update_gib
            lo, hi = (mid, hi) if fits <= self.limit_gib else (lo, mid)
        return lo


def activation_bytes_per_token_layer(m: ModelShape, compute_bytes: int = 2) -> float:
    """Forward activations one decoder layer saves for backward, per token (bf16 tensors, fp32 inside RMSNorm):
    the norm inputs/outputs (+ their fp32 upcasts), q/k/v and the attention output, the four SwiGLU tensors."""
    h, i = m.hidden_size, m.intermediate_size
    norms = 2 * (2 * h * compute_bytes + 2 * h * 4)
    attn = (2 * m.q_dim + 2 * m.kv_dim) * compute_bytes + m.num_attention_heads * 4  # + fp32 softmax lse
    mlp = 4 * i * compute_bytes
    return norms + attn + mlp


SAMPLER_BYTES_PER_ROW_TOKEN = 2 + 4 + 4 + 4 + 4  # bf16 logits, fp32 copy, fp32 log-probs, probs, exponential noise
UNPROFILED_LOGPROBS_BYTES = 4  # raw_* modes: the fp32 log-probs vLLM's profile run does not compute


def sampler_gib(m: ModelShape, s: Settings) -> tuple[float, float]:
    """(vLLM 0.24's sampler peak, the part of it outside vLLM's pool) per GPU, GiB (docs/gpu.md#sampler).

    vLLM samples `n = min(max_num_seqs, max_num_batched_tokens)` rows at most per decode step. With verl's
    `calculate_log_probs` (log-probs of the sampled tokens) and `temperature > 0`, `Sampler.forward` holds, over
    `n × vocab`: the model's bf16 logits (2 bytes), their fp32 copy (4), and in `TopKTopPSampler.forward_native` (bound
    whenever `logprobs_mode` is `processed_*`) the fp32 log-softmax it returns (4), the fp32 softmax (4) and the fp32
    exponential noise of `random_sample` (4): 18 bytes per row and vocabulary entry (Qwen2.5-7B, 1024 rows:
    18 × 1024 × 152,064 B = 2.61 GiB). vLLM's start-up profile (`_dummy_sampler_run`, the same n rows, top-k/top-p
    on) runs that same path, so in the `processed_*` modes the peak sits inside the pool (it shrinks the KV cache);
    with `raw_logprobs`/`raw_logits` the profile computes no log-probs, so their fp32 tensor (4 bytes) comes on top.
    """
    rows = max(min(int(s.max_num_seqs), int(s.max_num_batched_tokens)), 1)
    peak = SAMPLER_BYTES_PER_ROW_TOKEN * rows * m.vocab_size / GIB  # every TP rank samples the gathered logits
    outside = UNPROFILED_LOGPROBS_BYTES * rows * m.vocab_size / GIB if s.logprobs_mode.startswith("raw") else 0.0
    return peak, outside


def topk_backward_gib(tokens: int, vocab: int, compute_bytes: int = 2) -> float:
    """What the top-k KL's backward holds beyond verl's own at the update's logits moment, its support aside, GiB
    (docs/losses.md#topk-costs): its `(tokens, V)` logits gradient in the compute precision, and
    `TOPK_BACKWARD_FP32_CHUNKS` fp32 `(chunk, V)` tensors of the chunked log-sum-exp's backward
    (`rpg.topk_kl._ChunkedLogSumExp.backward`: a chunk of the bf16 logits upcast to fp32, and its difference from the
    log-sum-exp, exponentiated in place). Measured on an H200 within 1 % (docs/benchmarks.md#topk-kl-gpu)."""
    chunk = min(tokens, TOPK_CHUNK_TOKENS)
    return (tokens * vocab * compute_bytes + TOPK_BACKWARD_FP32_CHUNKS * chunk * vocab * 4) / GIB


class LoraTerms(NamedTuple):
    """A LoRA run's own terms, GiB per GPU (`lora_terms`)."""

    base: float  # the frozen base, in fsdp_config.model_dtype, sharded
    adapter: float  # the adapter, in the same dtype, sharded
    grads: float  # the adapter's gradients
    states: float  # the adapter's optimizer states (fp32)
    reference: float  # the reference adapter snapshot (fp32; the modes that write the reference)
    vllm: float  # vLLM's preallocated LoRA weights (inside its pool)

    def labelled(self, s: Settings) -> dict[str, float]:
        """The terms by name, as the dry-run summary and docs/gpu.md#lora show them."""
        dtype = next(k for k, v in DTYPE_BYTES.items() if v == s.param_bytes)
        vllm = (f"vLLM LoRA buffers (max_loras 1, max_lora_rank {s.vllm_lora_rank}, inside its pool)"
                if s.vllm_lora_rank else "vLLM LoRA buffers (none: lora.merge=True or no vLLM rollout)")
        return {f"frozen base ({dtype}; no grads, no optimizer states)": self.base, f"adapter ({dtype})": self.adapter,
                "adapter grads": self.grads, f"adapter optimizer states ({s.optimizer_states} fp32)": self.states,
                "reference adapter snapshot (fp32)": self.reference, vllm: self.vllm}


def lora_terms(m: ModelShape, s: Settings) -> Optional[LoraTerms]:
    """A LoRA run's own terms, GiB per GPU (docs/gpu.md#lora); None for full-weight training. verl's FSDP engine
    loads the base in ``fsdp_config.model_dtype`` and casts the adapter to it (fp32 by default), shards both over the
    GPUs, and trains only the adapter: gradients and optimizer states of the adapter alone. The reference has no
    engine of its own (verl's ``ref_in_actor``: the actor with its adapter disabled); a mode that writes the reference
    (periodic) keeps one fp32 snapshot of the adapter, sharded the same way. vLLM preallocates LoRA weights of
    ``max_lora_rank`` for one adapter (verl's ``max_loras=1``) inside its pool, none when the adapter is merged."""
    if not s.lora_rank:
        return None
    dp = max(s.n_gpus, 1)
    adapter = m.lora_params(s.lora_rank, s.lora_modules)
    return LoraTerms(base=m.param_count() * s.param_bytes / dp / GIB, adapter=adapter * s.param_bytes / dp / GIB,
                     grads=adapter * s.param_bytes / dp / GIB, states=s.optimizer_states * adapter * 4 / dp / GIB,
                     reference=s.lora_reference_copies * adapter * 4 / dp / GIB,
                     vllm=m.vllm_lora_bytes(s.vllm_lora_rank, s.rollout_tp, s.compute_bytes) / GIB)


def _lora_unsharded(m: ModelShape, s: Settings) -> tuple[float, float]:
    """(one decoder layer's adapter in the compute dtype, the root unit's trainable parameters: none under LoRA),
    GiB."""
    return m.lora_layer_params(s.lora_rank, s.lora_modules) * s.compute_bytes / GIB, 0.0


def estimate(m: ModelShape, s: Settings, budget_gib: float = DEFAULT_BUDGET_GIB, model: str = "") -> MemoryPlan:
    """The per-GPU plan of `m` under `s` (pure arithmetic, GiB)."""
    P, dp = m.param_count(), max(s.n_gpus, 1)
    lora = lora_terms(m, s)
    if lora:  # the frozen base and the adapter; gradients and optimizer states of the adapter only
        shard, grads, states = lora.base + lora.adapter, lora.grads, lora.states
    else:
        shard = P * s.param_bytes / dp / GIB
        grads = P * s.param_bytes / dp / GIB
        states = s.optimizer_states * P * 4 / dp / GIB
    trainer_fixed = {"CUDA contexts": CUDA_CONTEXT_GIB, "NCCL": NCCL_GIB}
    if lora and lora.reference:
        trainer_fixed["reference adapter snapshot (fp32)"] = lora.reference

    # rollout: vLLM awake; its pool is a fraction of the total CUDA reports
    hidden = cuda_hidden_gib(budget_gib)
    pool = s.gpu_memory_utilization * (budget_gib - hidden)
    vllm_weights = P * 2 / s.rollout_tp / GIB
    if lora:  # vLLM's LoRA buffers sit beside its weights, inside the pool
        vllm_weights += lora.vllm
    sampler_peak, sampler_outside = sampler_gib(m, s)
    rollout = {
        f"vLLM pool ({s.gpu_memory_utilization:g} × CUDA's total)": pool,
        "vLLM sampler beyond its profile": sampler_outside,
        "vLLM CUDA context": CUDA_CONTEXT_GIB,
        **trainer_fixed,
        "actor params": 0.0 if s.param_offload else shard,
        "optimizer states": 0.0 if s.optimizer_offload else states,
    }
    largest_tensor = m.vocab_size * m.hidden_size * s.compute_bytes / GIB
    sync = (CUDA_CONTEXT_GIB * 2 + NCCL_GIB + VLLM_SLEEP_REMAINDER_GIB + vllm_weights + shard
            + (0.0 if s.optimizer_offload else states) + s.weight_bucket_mib / 1024 + largest_tensor)
    if lora:
        sync += lora.reference  # the reference adapter snapshot stays on the GPU

    # update: vLLM asleep
    vllm_asleep = CUDA_CONTEXT_GIB + (VLLM_SLEEP_REMAINDER_GIB if s.free_cache_engine else pool)
    root_unsh = m.root_params() * s.compute_bytes / GIB
    layer_unsh = m.layer_params() * s.compute_bytes / GIB
    unsharded = root_unsh + 2 * layer_unsh  # root unit + the current and the prefetched layer
    layer_grad_unsh, root_grad_unsh = layer_unsh, root_unsh  # the unsharded units' gradients
    if lora:  # the adapter's units beside the base's; gradients of the adapter only
        layer_grad_unsh, root_grad_unsh = _lora_unsharded(m, s)
        unsharded += 2 * layer_grad_unsh
    T = max(int(s.update_tokens), 1)
    act_layer = activation_bytes_per_token_layer(m, s.compute_bytes) * T / GIB
    if s.gradient_checkpointing:
        acts = m.num_hidden_layers * T * m.hidden_size * s.compute_bytes / GIB + 2 * act_layer
    else:
        acts = m.num_hidden_layers * act_layer + act_layer
    logit_copies = 0.0 if s.fused_kernels else 1.0 + (3.0 if s.entropy else 0.0)
    logits = logit_copies * T * m.vocab_size * s.compute_bytes / GIB
    torch_ce = 0.0 if s.fused_kernels or s.flash_ce else TORCH_CE_FP32_COPIES * T * m.vocab_size * 4 / GIB
    if s.fused_kernels:
        logits = 2 * T * m.hidden_size * 4 / GIB  # chunked fused linear-CE: a few fp32 hidden-size buffers
    base = {**trainer_fixed, "vLLM asleep": vllm_asleep, "param shards": shard, "grad shards": grads,
            "optimizer states": states}
    backward = {**{k: v for k, v in base.items() if s.accumulated_grads or k != "grad shards"},
                "unsharded params (bf16)": unsharded, "unsharded grads": root_grad_unsh + layer_grad_unsh,
                "activations": acts, "logits": logits, "logits fp32 (torch CE, no flash-attn)": torch_ce}
    end_backward = {**base, "unsharded params (bf16)": root_unsh + layer_unsh,
                    "unsharded grads": m.root_params() * (s.compute_bytes + s.reduce_bytes) / GIB}
    step = {**base, "optimizer step temp": shard if s.foreach_step else m.root_params() * 4 / dp / GIB}
    if lora:  # the last unit's gradient is one layer's adapter, cast for the reduce; the step's temp an adapter shard
        end_backward["unsharded grads"] = layer_grad_unsh * (s.compute_bytes + s.reduce_bytes) / s.compute_bytes
        step["optimizer step temp"] = (states / s.optimizer_states if s.foreach_step
                                        else layer_grad_unsh * 4 / s.compute_bytes / dp)
    Ti = max(int(s.infer_tokens), 1)
    infer = {**{k: v for k, v in base.items() if k != "grad shards"}, "unsharded params (bf16)": unsharded,
             "activations": 2 * activation_bytes_per_token_layer(m, s.compute_bytes) * Ti / GIB,
             "logits": (0.0 if s.fused_kernels else 1.0 + (2.0 if s.entropy else 0.0))
             * Ti * m.vocab_size * s.compute_bytes / GIB}
    if s.topk:  # docs/losses.md#topk-costs: 8·k bytes per token, the chunked log-sum-exp, its own logits gradient
        chunk_infer = min(Ti, TOPK_CHUNK_TOKENS)
        backward["top-k KL support (8·k B/token)"] = TOPK_SUPPORT_BYTES * s.topk * T / GIB
        backward["top-k KL logits gradient + fp32 chunks"] = topk_backward_gib(T, m.vocab_size, s.compute_bytes)
        infer["top-k KL support + selection chunk"] = (
            TOPK_SUPPORT_BYTES * s.topk * Ti + 2 * chunk_infer * m.vocab_size * 4) / GIB
    update_moments = {"backward": backward, "end of backward": end_backward, "optimizer step": step, "log-prob": infer}
    name, update = max(update_moments.items(), key=lambda kv: sum(kv[1].values()))
    plan = MemoryPlan(model=model or m.name, budget_gib=budget_gib, settings=s, shape=m, rollout=rollout,
                      update={"moment: " + name: 0.0, **update}, cuda_hidden_gib=hidden,
                      lora=lora.labelled(s) if lora else {},
                      lora_params=m.lora_params(s.lora_rank, s.lora_modules) if lora else 0)
    plan.moments = {"rollout (KV resumed)": sum(rollout.values()), "weight sync": sync,
                    **{k: sum(v.values()) for k, v in update_moments.items()}}
    if sync > plan.rollout_gib:  # the weight-sync moment is part of the rollout phase
        plan.rollout = {"moment: weight sync": 0.0, "trainer + vLLM weights + bucket": sync}
    plan.startup_free_needed_gib = pool
    plan.startup_trainer_gib = CUDA_CONTEXT_GIB + NCCL_GIB + (0.0 if s.param_offload else shard)
    # the pool less vLLM's weights, its profiled sampler peak and ~1 GiB of other activations and non-torch memory
    plan.kv_cache_gib = pool - vllm_weights - (sampler_peak - sampler_outside) - 1.0
    plan.sampler_gib = sampler_peak
    return plan


# ----------------------------------------------------------------------------------------------------------------
# The model's shape: its config.json (a local folder, the Hugging Face cache) or the shipped table
# ----------------------------------------------------------------------------------------------------------------
def shipped_models() -> dict:
    data = json.loads(MODEL_TABLE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def load_model_shape(path: str, hf_config_path: Optional[str] = None) -> ModelShape:
    """The model's shape from (1) a local directory's config.json, (2) the Hugging Face cache, (3) the shipped table
    of the recipe models. Raises ValueError naming actor_rollout_ref.model.path when none has it."""
    src = str(hf_config_path or path)
    local = Path(os.path.expanduser(src))
    if local.is_dir() and (local / "config.json").is_file():
        return ModelShape.from_dict(str(path), _text_config(json.loads((local / "config.json").read_text())))
    if local.is_file() and local.name.endswith(".json"):
        return ModelShape.from_dict(str(path), _text_config(json.loads(local.read_text())))
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    cached = sorted(glob.glob(os.path.join(hub, "models--" + src.replace("/", "--"), "snapshots", "*", "config.json")))
    if cached:
        return ModelShape.from_dict(str(path), _text_config(json.loads(Path(cached[-1]).read_text())))
    table = shipped_models()
    if src in table:
        return ModelShape.from_dict(src, table[src])
    raise ValueError(
        f"GPU memory plan: actor_rollout_ref.model.path={path!r} has no config.json on disk or in the Hugging Face "
        f"cache, and is not one of the shipped recipe models ({', '.join(sorted(table))}); download the model first "
        f"(hf download {src} config.json) or pass its local directory.")


def _text_config(cfg: dict) -> dict:
    return cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg


def optimizer_states(name: str) -> tuple[int, bool]:
    """(fp32 states per parameter, whether the step is torch's foreach kind) of an optimizer class name."""
    low = name.lower()
    if "schedulefree" in low:
        return 2, False  # z and exp_avg_sq (rpg/schedule_free.py), per-parameter step
    if "adam" in low:
        return 2, True
    if low == "sgd":
        return 1, True
    return 2, True  # unknown: assume Adam-like
