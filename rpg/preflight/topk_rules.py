"""The launch rules of the top-k KL (`policy_loss.kl_estimator=topk`, docs/losses.md#topk-kl): the verl settings
under which its engine hook (`rpg.topk_hook`) cannot run, each refused before Ray starts with the setting, the value,
the reason and the fix. The loss-level refusals (branch_on, kl_placement, kl_clamp, kl_ratio) are the config's own
(`rpg.loss_config.topk_errors`)."""

from __future__ import annotations

from typing import Any, Optional

from omegaconf import DictConfig

from rpg import modes
from rpg.preflight.memory import load_model_shape

__all__ = ["rule_topk_engine", "topk_engine_errors", "vocab_size"]


def vocab_size(config: DictConfig) -> Optional[int]:
    """The model's vocabulary (its config.json, the HF cache or the shipped table), None when unknown."""
    model = config.actor_rollout_ref.model
    try:
        return load_model_shape(str(model.path), model.get("hf_config_path", None)).vocab_size
    except (ValueError, OSError, KeyError, TypeError):
        return None


def topk_engine_errors(config: DictConfig, settings: Any) -> list[str]:
    """One message per verl setting the top-k KL's engine hook cannot run with (none unless kl_estimator='topk')."""
    if not getattr(settings, "topk", False):
        return []
    arr, out = config.actor_rollout_ref, []
    what = "policy_loss.kl_estimator=topk"
    iterative = not settings.needs_ref_log_prob  # the KL's reference is π_old
    if bool(arr.model.get("use_fused_kernels", False)):
        out.append(f"actor_rollout_ref.model.use_fused_kernels=True cannot run with {what}: the fused kernels never "
                   "materialise the logits over the vocabulary, which the support selection and the analytic KL read. "
                   "Set use_fused_kernels=False")
    for role in ("actor", "ref"):
        if bool(arr[role].get("pad_to_length", False)):
            out.append(f"actor_rollout_ref.{role}.pad_to_length=True cannot run with {what}: the hook aligns the "
                       "support with the packed tokens, which the static padding shifts (verl's own top-k hook "
                       "refuses it too). Set pad_to_length=False")
        sp = int(arr[role].get("ulysses_sequence_parallel_size", 1) or 1)
        if sp > 1:
            out.append(f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size={sp} cannot run with {what}: the "
                       "support would have to be sliced to each rank's shard of the packed sequence in the update, "
                       "which rpg does not implement yet. Set ulysses_sequence_parallel_size=1")
    strategy = str(arr.actor.get("strategy", "fsdp2"))
    if strategy not in ("fsdp", "fsdp2"):
        out.append(f"actor_rollout_ref.actor.strategy={strategy} cannot run with {what}: the hook wraps verl's FSDP "
                   "engine (FSDPEngineWithLMHead.prepare_model_outputs). Use strategy=fsdp2")
    # LoRA runs: verl's reference pass is the actor's compute_log_prob with no_lora_adapter=True, which the hook
    # treats as the reference's pass (rpg.topk_hook.pass_of; docs/reference-modes.md#lora)
    distillation = config.get("distillation", None) or {}
    if bool(distillation.get("enabled", False)):
        out.append(f"distillation.enabled=True cannot run with {what}: verl's distillation owns the same logits hook "
                   "(distillation_use_topk) and its loss does not reach the RPG loss's KL. Disable distillation")
    corr = config.algorithm.get("rollout_correction", None) or {}
    if iterative and bool(corr.get("bypass_mode", False)):
        out.append(f"algorithm.rollout_correction.bypass_mode=True cannot run with {what} and reference="
                   f"{settings.reference!r}: π_old is then the rollout's (vLLM's), which gives the sampled token's "
                   "log-prob only, no top-k. Set bypass_mode=False (OLD_LOGPROB=recompute) or a frozen/periodic/ema "
                   "reference")
    trainer = modes.trainer_mode(config)  # the trainer-mode table's row (rpg/modes.py)
    if not trainer.use_v1:
        out.append(f"trainer.use_v1=False cannot run with {what}: the support travels through the v1 trainer's "
                   "TransferQueue between the log-prob passes and the update. Set trainer.use_v1=True")
    if trainer.detached_actor:
        out.append(f"trainer.v1.trainer_mode={trainer.name} cannot run with {what}: its DetachActorWorker is not "
                   "the worker the hook wraps (untested). Use sync or colocate_async")
    vocab = vocab_size(config)
    if vocab is not None and settings.kl_topk > vocab:
        out.append(f"actor_rollout_ref.actor.policy_loss.kl_topk={settings.kl_topk} is above the vocabulary of "
                   f"actor_rollout_ref.model.path ({vocab} tokens): the support holds k distinct ids per position. "
                   f"Choose kl_topk ≤ {vocab}")
    return out


def rule_topk_engine(config: DictConfig, settings: Any) -> Optional[str]:
    """The RPG rule (`rpg.preflight.rpg_rules.RPG_RULES`): all of `topk_engine_errors` as one message, or None."""
    errors = topk_engine_errors(config, settings)
    return "; ".join(errors) if errors else None
