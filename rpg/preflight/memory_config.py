"""The GPU memory plan of a validated run (docs/gpu.md#memory-plan): the plan's `Settings` read from the typed config
`rpg.launch.validate` builds once (`rpg.preflight.verl_configs.ValidatedConfig`: verl's actor, rollout and checkpoint
engine dataclasses, the RPG options), the GPU's budget, the plan, and a smoke run's measured peaks against it.

The arithmetic is `rpg.preflight.memory`'s (pure numbers, no config). A setting read here has its default in one place
only: verl's dataclass or yaml for verl's settings, `rpg.loss_options.RPGOptions` for the RPG options.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Optional

from rpg import modes
from rpg.preflight.gpu_probe import probe
from rpg.preflight.lora_config import lora_settings
from rpg.preflight.lora_rules import vllm_lora_rank, vllm_ranks, vllm_serves_adapter
from rpg.preflight.memory import (
    DEFAULT_BUDGET_GIB,
    DTYPE_BYTES,
    GIB,
    MemoryPlan,
    ModelShape,
    Settings,
    estimate,
    load_model_shape,
    lora_modules,
    optimizer_states,
)

BUDGET_ENV = "GPU_MEMORY_GIB"
ESTIMATED_STRATEGIES = ("fsdp", "fsdp2")
_MIXED_PRECISION = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
#: verl 0.9.1's FSDP mixed precision when `fsdp_config.mixed_precision` leaves a dtype out (fsdp_workers.py's
#: `mixed_precision_config.get("param_dtype", "bf16")`, ...): verl's code holds these defaults, not a config class
VERL_MIXED_PRECISION = {"param_dtype": "bf16", "reduce_dtype": "fp32"}


def _bytes(name: Any, setting: str) -> int:
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise ValueError(f"GPU memory plan: {setting}={name!r} is not a dtype the plan knows; "
                         f"choose one of {sorted(set(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


def flash_ce_available() -> bool:
    """Whether verl 0.9.1 takes flash-attn's in-place cross-entropy in this environment (verl/utils/torch_functional.py:
    the `flash_attn` package importable, VERL_DISABLE_FLASH_ATTN_CE unset); else torch's path (more logits copies)."""
    return importlib.util.find_spec("flash_attn") is not None and os.environ.get("VERL_DISABLE_FLASH_ATTN_CE") != "1"


def topk_width(rpg: Any) -> int:
    """k of the top-k KL's support the run's RPG settings select (`RPGPolicyLossConfig.topk`: kl_estimator=topk),
    else 0 (the sampled estimator; `rpg` None: verl's own loss)."""
    return int(rpg.kl_topk) if rpg is not None and rpg.topk else 0


def lora_fields(validated: Any) -> dict[str, Any]:
    """The plan's LoRA settings of a validated run (`rpg.preflight.lora_config.lora_settings`, as verl reads them):
    the rank and adapted layers, vLLM's max_lora_rank when the adapter itself reaches vLLM (verl's
    ``get_vllm_max_lora_rank`` rule, `rpg.preflight.lora_rules`), and one fp32 reference snapshot of the adapter for a
    reference mode that writes the reference (periodic). Empty for full-weight training."""
    lora = lora_settings(validated.config)
    if lora.rank <= 0:
        return {}
    serves = vllm_serves_adapter(validated.config)
    writes = validated.rpg is not None and modes.selected(validated.rpg)[0].writes_reference
    return {"lora_rank": lora.rank, "lora_modules": lora_modules(lora.target_modules),
            "vllm_lora_rank": vllm_lora_rank(lora.rank, vllm_ranks()) if serves else 0,
            "lora_reference_copies": int(writes)}


def _micro_batch_tokens(dynamic: bool, max_tokens: Any, micro: Any, seq: int, setting: str) -> int:
    """Tokens of one micro-batch on one GPU: the dynamic budget (a sequence longer than it still forms its own
    micro-batch), or the static micro-batch × the longest sequence."""
    if dynamic:
        if max_tokens is None:
            raise ValueError(f"GPU memory plan: {setting} is unset with dynamic batch sizes")
        return max(int(max_tokens), seq)
    if micro is None:
        raise ValueError(f"GPU memory plan: {setting} is unset (set it, or use_dynamic_bsz=True)")
    return int(micro) * seq


def _dtypes(fsdp: Any) -> dict[str, int]:
    """Bytes of the actor's parameter (`model_dtype`), compute and gradient-reduce dtypes."""
    mp = {**VERL_MIXED_PRECISION, **(fsdp.mixed_precision or {})}
    return {"param_bytes": _bytes(fsdp.model_dtype, "actor_rollout_ref.actor.fsdp_config.model_dtype"),
            "compute_bytes": _bytes(mp["param_dtype"], f"{_MIXED_PRECISION}.param_dtype"),
            "reduce_bytes": _bytes(mp["reduce_dtype"], f"{_MIXED_PRECISION}.reduce_dtype")}


def settings_from_config(validated: Any, flash_ce: Optional[bool] = None) -> Settings:
    """`Settings` of a validated run (`ValidatedConfig`: the typed actor, rollout and checkpoint engine; the composed
    config for the model, data and trainer); `flash_ce` None: `flash_ce_available()` here (the launcher runs in the
    run's environment)."""
    config, actor, rollout = validated.config, validated.actor, validated.rollout
    model, data = config.actor_rollout_ref.model, config.data
    seq = int(data.max_prompt_length) + int(data.max_response_length)
    update_tokens = _micro_batch_tokens(actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu,
                                        actor.ppo_micro_batch_size_per_gpu, seq,
                                        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    infer_tokens = _micro_batch_tokens(rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu,
                                       rollout.log_prob_micro_batch_size_per_gpu, seq,
                                       "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")
    n_states, foreach = optimizer_states(str(actor.optim.optimizer))
    return Settings(
        n_gpus=int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes),
        update_tokens=update_tokens,
        infer_tokens=infer_tokens,
        gpu_memory_utilization=float(rollout.gpu_memory_utilization),
        rollout_tp=int(rollout.tensor_model_parallel_size),
        free_cache_engine=bool(rollout.free_cache_engine),
        param_offload=bool(actor.fsdp_config.param_offload),
        optimizer_offload=bool(actor.fsdp_config.optimizer_offload),
        **_dtypes(actor.fsdp_config),
        optimizer=str(actor.optim.optimizer),
        optimizer_states=n_states,
        foreach_step=foreach,
        gradient_checkpointing=bool(model.enable_gradient_checkpointing),
        fused_kernels=bool(model.use_fused_kernels),
        flash_ce=flash_ce_available() if flash_ce is None else bool(flash_ce),
        entropy=bool(actor.calculate_entropy) or float(actor.entropy_coeff) != 0.0,
        reference=validated.ref is not None,  # verl builds the reference model (need_reference_policy)
        weight_bucket_mib=int(validated.checkpoint_engine.update_weights_bucket_megabytes),
        strategy=str(actor.strategy),
        max_num_seqs=int(rollout.max_num_seqs),
        max_num_batched_tokens=int(rollout.max_num_batched_tokens),
        logprobs_mode=str(rollout.logprobs_mode),
        topk=topk_width(validated.rpg),
        **lora_fields(validated),
    )


def budget_from_env(node: Any = None) -> float:
    """GPU_MEMORY_GIB if set, else the smallest total memory of this node's GPUs as NVML reports it (`node`, a
    `rpg.preflight.gpu_probe.NodeProbe`; default: asked in a child process, so the launcher creates no CUDA context),
    else 80."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ValueError(f"{BUDGET_ENV}={raw!r} is not a positive number of GiB (e.g. {BUDGET_ENV}=80)")
        return value
    if node is None:
        node = probe(("nvml",))
    if node.gpu_total_bytes:
        return min(node.gpu_total_bytes) / GIB
    return DEFAULT_BUDGET_GIB


def memory_plan(validated: Any, model_cfg: Optional[dict] = None, budget_gib: Optional[float] = None,
                flash_ce: Optional[bool] = None) -> MemoryPlan:
    """The per-GPU plan of a validated run (`ValidatedConfig`). `model_cfg`: a config.json dict (default: read from
    actor_rollout_ref.model.path, the HF cache or the shipped table); `budget_gib`: default `budget_from_env()`;
    `flash_ce`: flash-attn's cross-entropy (default: whether this environment has it, `flash_ce_available`)."""
    model = validated.config.actor_rollout_ref.model
    path = str(model.path)
    if model_cfg is not None:
        shape = ModelShape.from_dict(path, model_cfg)
    else:
        shape = load_model_shape(path, model.hf_config_path)
    strategy = str(validated.actor.strategy)
    if strategy not in ESTIMATED_STRATEGIES:
        raise ValueError(f"GPU memory plan: actor_rollout_ref.actor.strategy={strategy!r} is not estimated; "
                         f"it covers {' and '.join(ESTIMATED_STRATEGIES)}")
    budget = budget_from_env() if budget_gib is None else float(budget_gib)
    return estimate(shape, settings_from_config(validated, flash_ce), budget, model=path)


def smoke_comparison(validated: Any, report: Any) -> str:
    """A smoke run's measured peaks (`rpg.smoke.SmokeReport`: `update_gib`, `gpu_peaks`, `device`) against the plan of
    the validated recipe, as benchmarks/gpu_memory_probe.py compares them: the actor workers' torch allocation peak
    against the update phase less what lies outside their allocator (CUDA contexts, NCCL, the sleeping vLLM), NVML's
    peak used on a GPU against the rollout phase, on the budget of the smallest GPU measured; OK unless a measurement
    exceeds the plan by more than 0.5 GiB. "" when nothing was measured (CPU) or the plan cannot be made."""
    if report.device == "cpu" or not (report.update_gib or report.gpu_peaks):
        return ""
    budget = min((t for _, t in report.gpu_peaks.values()), default=DEFAULT_BUDGET_GIB * GIB) / GIB
    try:
        plan = memory_plan(validated, budget_gib=budget)
    except ValueError:
        return ""
    outside = sum(plan.update.get(k, 0.0) for k in ("CUDA contexts", "NCCL", "vLLM asleep"))
    used = max((u for u, _ in report.gpu_peaks.values()), default=None)
    alloc = report.update_gib[0] if report.update_gib else None
    pairs = [("update, torch allocated", alloc, plan.update_gib - outside),
             ("rollout, GPU used (NVML)", used / GIB if used else None, plan.rollout_gib)]
    parts, low = [], []
    for label, measured, planned in pairs:
        if measured is not None:
            parts.append(f"{label} {measured:.1f} GiB vs planned {planned:.1f}")
            low += [label] if measured > planned + 0.5 else []
    verdict = "OK" if not low else (f"PLAN TOO LOW for {', '.join(low)}: report it "
                                    "(docs/gpu.md#checking-the-plan-on-one-gpu)")
    return f"[rpg smoke] memory vs plan (budget {budget:.1f} GiB): {'; '.join(parts)}; verdict {verdict}\n"
