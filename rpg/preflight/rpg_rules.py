"""The RPG loss rules: what a composed config must satisfy for the plugin's losses (registered names, usable clip
fields, the `RPGPolicyLossConfig` target and its fields, bypass mode only in the v1 trainer, no in-reward KL, the
reference model exactly when the loss or the reference mode needs one, the periodic reference not in separate_async).
Driven by the loss table (`rpg.loss_table`)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from omegaconf import DictConfig

from rpg import modes
from rpg.kl_aggregation import rule_kl_aggregation
from rpg.loss_table import ADDON, LOSSES, RPG_POLICY_LOSS_TARGETS, VERL_CLIP_FIELDS, clip_fields
from rpg.preflight.compose import RecipeConfigError
from rpg.preflight.lora_config import LoraSettings, lora_settings
from rpg.preflight.topk_rules import rule_topk_engine
from rpg.reference.lora_modes import lora_reference


def check_registered(config: DictConfig) -> None:
    """`policy_loss.loss_mode` and `algorithm.adv_estimator` must be names in verl's registries (`import verl` loads
    the `verl.plugins` entry point `rpg.verl_plugin`, which registers the RPG names)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as estimators, POLICY_LOSS_REGISTRY as losses

    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    if loss_mode not in losses:
        rpg_names = sorted(n for n in losses if n in LOSSES)
        none = "(none registered: verl did not load the rpg plugin; `python -c 'import rpg.verl_plugin'` says why)"
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is not a registered policy loss. "
            f"RPG losses: {rpg_names or none}; "
            f"verl built-ins: {sorted(n for n in losses if n not in LOSSES)}"
        )
    adv = config.algorithm.adv_estimator
    if adv not in estimators:
        raise RecipeConfigError(
            f"algorithm.adv_estimator={adv!r} is not a registered advantage estimator; valid: {sorted(estimators)}"
        )


def _rpg_policy_loss(config: DictConfig, built: Any):
    """`actor.policy_loss` as `RPGPolicyLossConfig`: `built`, the one the launcher's `build_verl_configs` built with
    the actor (its __post_init__ validated every field against the loss table; it changes nothing outside it: what the
    run needs from verl is `rpg.install`'s, checked by the launcher's `validate`), after checking the `_target_` that
    made it one."""
    from rpg.loss_config import RPGPolicyLossConfig  # imports verl's config classes

    policy_loss = config.actor_rollout_ref.actor.policy_loss
    target = policy_loss.get("_target_")
    if target not in RPG_POLICY_LOSS_TARGETS:
        raise RecipeConfigError(
            f"loss_mode={policy_loss.loss_mode!r} reads the RPG settings, but actor_rollout_ref.actor.policy_loss."
            f"_target_={target!r}; add the override "
            f"actor_rollout_ref.actor.policy_loss._target_={RPG_POLICY_LOSS_TARGETS[0]}"
        )
    assert isinstance(built, RPGPolicyLossConfig), type(built)
    return built


def _rule_bypass(config: DictConfig, settings) -> Optional[str]:
    """Bypass mode (π_old := μ, docs/async.md#bypass) runs the RPG loss in the v1 trainer only; there it skips the
    rollout correction, so TIS weights or rejection sampling set next to it would be silently ignored."""
    from rpg.loss_config import bypass_error  # imports verl's config classes

    corr = config.algorithm.get("rollout_correction", None) or {}
    if not corr.get("bypass_mode", False):
        return None
    if not config.trainer.get("use_v1", True):
        return bypass_error(corr)
    ignored = [f"algorithm.rollout_correction.{key}={corr.get(key)!r}" for key in ("rollout_is", "rollout_rs")
               if corr.get(key, None) is not None]
    if ignored:
        return (
            f"algorithm.rollout_correction.bypass_mode=True (recipe knob OLD_LOGPROB=rollout) with "
            f"{' and '.join(ignored)}: verl's v1 trainer skips the rollout correction in bypass mode (π_old is the "
            f"rollout's μ, the weights would be μ/μ ≡ 1), so this would be silently ignored. Fix: remove "
            f"{' and '.join(k.split('=')[0] for k in ignored)} (set null), or keep the correction and recompute π_old "
            f"(bypass_mode=False, OLD_LOGPROB=recompute; docs/async.md#bypass)"
        )
    return None


def _rule_no_kl_in_reward(config: DictConfig, settings) -> Optional[str]:
    if config.algorithm.get("use_kl_in_reward", False):
        return (
            "algorithm.use_kl_in_reward=True cannot be combined with an RPG loss: verl's in-reward KL is evaluated "
            "at π_old/π_ref before the update, summed into the advantage and multiplied by w, which realises no RPG "
            "estimator (docs/differences.md#d2) and would add a second KL on top of the loss's own. Set "
            "algorithm.use_kl_in_reward=False; the RPG KL is the loss's policy_loss.kl_coef (β)."
        )
    return None


def _rule_reference_model(config: DictConfig, settings) -> Optional[str]:
    actor = config.actor_rollout_ref.actor
    use_kl_loss, coef = bool(actor.use_kl_loss), float(actor.kl_loss_coef)
    if settings.needs_ref_log_prob and not (use_kl_loss and coef == 0.0):
        why = (
            f"loss_mode={settings.loss_mode!r}"
            if settings.spec.needs_reference
            else f"policy_loss.reference={settings.reference!r}"
        )
        return (
            f"{why} needs verl's reference model: set actor_rollout_ref.actor.use_kl_loss=True (so verl builds "
            f"the reference worker and ships ref_log_prob to the loss) and actor_rollout_ref.actor.kl_loss_coef=0 "
            f"(so verl adds no KL of its own; the loss's β is policy_loss.kl_coef). Got use_kl_loss={use_kl_loss}, "
            f"kl_loss_coef={coef}."
        )
    if not settings.needs_ref_log_prob and use_kl_loss and coef != 0.0:
        return (
            f"policy_loss.reference='iterative' (π_ref = π_old, paper §5) with actor.use_kl_loss=True and "
            f"kl_loss_coef={coef}: verl would add its own {actor.kl_loss_type!r} KL against a frozen reference "
            f"model on top of the RPG KL. Set actor_rollout_ref.actor.use_kl_loss=False (the RPG β is "
            f"policy_loss.kl_coef), or use policy_loss.reference=frozen with kl_loss_coef=0."
        )
    return None


def _hooked_features(settings) -> list[str]:
    """The settings that run through the worker hooks of `rpg.reference.hooks` (the rows with worker state)."""
    return [f"policy_loss.{row.setting}={row.name}" for row in modes.selected(settings) if row.worker_state]


def _rule_periodic_not_separate_async(config: DictConfig, settings) -> Optional[str]:
    mode = modes.trainer_mode(config)  # the trainer-mode table's row (rpg/modes.py)
    features = _hooked_features(settings)
    if not features or not mode.detached_actor:
        return None
    return (
        f"{' and '.join(features)} with trainer.v1.trainer_mode={mode.name} (recipe knob TRAINER_MODE): "
        f"untested: {mode.name} replaces the actor worker by verl's DetachActorWorker and updates once per "
        "mini-batch, which the reference/adaptive-β worker hooks were not written for. Fix: TRAINER_MODE="
        "colocate_async (measured working with the periodic reference) or sync, or reference=iterative/frozen and "
        "kl_control=fixed"
    )


def lora_what(lora: LoraSettings) -> str:
    """The overrides that make a run a LoRA run, for messages."""
    what = [f"{lora.rank_setting}={lora.rank}"] if lora.rank > 0 else []
    if lora.adapter_path is not None:
        what.append(f"actor_rollout_ref.model.lora_adapter_path={lora.adapter_path}")
    return " and ".join(what)


def _rule_written_reference_engine(config: DictConfig, settings) -> Optional[str]:
    """periodic/ema write the reference's weights in the actor's process: verl's fused actor+reference worker with
    FSDP engines, or, under LoRA, the snapshot of the actor's adapter (periodic; ema refused,
    `rpg.reference.lora_modes`, docs/reference-modes.md#lora); ema also needs the reference stored in fp32 (the blend
    is in place)."""
    row = modes.reference(settings.reference)
    if not row.writes_reference:
        return None
    arr, problems = config.actor_rollout_ref, []
    lora = lora_settings(config)
    roles = ("actor",) if lora.enabled else ("actor", "ref")  # a LoRA run has no reference engine
    strategies = {role: str(arr[role].get("strategy", "fsdp2")) for role in roles}
    bad = [f"actor_rollout_ref.{r}.strategy={v}" for r, v in strategies.items() if v not in ("fsdp", "fsdp2")]
    if bad:
        problems.append(f"{' and '.join(bad)} (the weight copy/blend works on FSDP engines only: fsdp2)")
    refusal = lora_reference(row.name).refusal if lora.enabled else ""
    if refusal:
        problems.append(f"LoRA ({lora_what(lora)}): {refusal}")
    dtype = str(((arr.ref.get("fsdp_config", None) or {}).get("model_dtype", None)) or "fp32")
    if row.fp32_reference and not lora.enabled and dtype not in ("fp32", "float32"):
        problems.append(f"actor_rollout_ref.ref.fsdp_config.model_dtype={dtype} (the EMA blend is done in place on "
                        f"the reference's shards and needs fp32 storage: a bf16 blend at τ≈0.99 never moves; set "
                        f"fp32)")
    if not problems:
        return None
    return f"policy_loss.reference={settings.reference} cannot run with " + "; ".join(problems)


def _rule_no_adaptive_kl_ctrl(config: DictConfig, settings) -> Optional[str]:
    ctrl = config.algorithm.get("kl_ctrl", None) or {}  # verl's own controller types carry the same names
    if not modes.KL_CONTROLS.get(str(ctrl.get("type", None)), modes.KL_CONTROLS["fixed"]).moves_beta:
        return None
    return (
        "algorithm.kl_ctrl.type=adaptive next to an RPG loss: verl's controller adapts only the in-reward KL "
        "(use_kl_in_reward), which RPG runs do not use, so it would be silently ignored. For an adaptive β of the RPG "
        "loss set +actor_rollout_ref.actor.policy_loss.kl_control=adaptive "
        "+actor_rollout_ref.actor.policy_loss.kl_target=<KL per token> +actor_rollout_ref.actor.policy_loss."
        "kl_horizon=<H in training steps> (β starts at policy_loss.kl_coef; docs/losses.md#adaptive-beta), and keep "
        "algorithm.kl_ctrl.type=fixed"
    )


RPG_RULES: tuple[Callable[[DictConfig, Any], Optional[str]], ...] = (
    _rule_bypass,
    _rule_no_kl_in_reward,
    _rule_reference_model,
    _rule_periodic_not_separate_async,
    _rule_written_reference_engine,
    _rule_no_adaptive_kl_ctrl,
    rule_kl_aggregation,  # seq-mean-token-mean / an unscaled -norm make the KL inexact (docs/losses.md#kl-aggregation)
    rule_topk_engine,  # kl_estimator=topk: the verl settings its engine hook cannot run with (docs/losses.md#topk-kl)
)


def validate_rpg(config: DictConfig, policy_loss: Any):
    """Check the loss rules on a composed config; return the `RPGPolicyLossConfig` (None for verl's own losses):
    `policy_loss`, the typed `actor.policy_loss` already built from `config` (the launcher's `ValidatedConfig`; its
    field errors are `build_verl_configs`'s refusal).

    The loss table (`rpg.loss_table.LOSSES`, `python -m rpg.launch --list`) drives them. All violations are reported
    together:
    * `loss_mode` and `adv_estimator` are registered (the valid names are listed on error);
    * every clip field the loss reads (its table row, or verl's vanilla/gspo/cispo) is usable: ε1 ∈ (0, 1),
      ε2 > 0, c > 1 (verl itself checks c only inside the loss, at the first update);
    * RPG loss ⇒ `policy_loss._target_` is `rpg.RPGPolicyLossConfig` (its fields, including that no option is set
      that cannot change this loss or reference mode, `rpg.loss_config.ineffective_options`, were checked when it was
      built);
    * RPG loss with `algorithm.rollout_correction.bypass_mode=True` ⇒ the v1 trainer (rpg.loss_config.BYPASS_ERROR) and
      no `rollout_is`/`rollout_rs` (the v1 trainer skips the correction in bypass: they would be ignored);
    * the KL add-on (`rpg_kl_<div>`) ⇒ the clip fields its `base_loss_mode` reads are usable;
    * RPG loss (the KL add-on included) ⇒ `algorithm.use_kl_in_reward=False` (docs/differences.md#d2);
    * `reference=iterative` ⇒ no verl KL loss with a non-zero coefficient (it would be a second KL);
    * `reference` frozen/periodic, or a loss that needs a reference (`grpo_wk3`) ⇒ `use_kl_loss=True` and
      `kl_loss_coef=0` (verl builds the reference model and ships `ref_log_prob`, but adds nothing itself);
    * `reference=periodic|ema` or `kl_control=adaptive` ⇒ not `trainer.v1.trainer_mode=separate_async` (untested);
    * `reference=periodic|ema` ⇒ FSDP engines (the fused worker's reference engine, or under LoRA the snapshot of
      the actor's adapter); `ema` ⇒ no LoRA (`rpg.reference.lora_modes.EMA_REFUSAL`) and the reference stored in
      fp32;
    * no `algorithm.kl_ctrl.type=adaptive` (ignored by RPG runs; the pointer to `policy_loss.kl_control=adaptive`);
    * an aggregation that keeps the KL exact (`rpg.kl_aggregation`);
    * `kl_estimator=topk` ⇒ no fused kernels, pad_to_length, Ulysses SP, distillation, bypass mode with the
      iterative reference, legacy or separate_async trainer; `kl_topk` ≤ the vocabulary (`rpg.preflight.topk_rules`);
    """
    from rpg.loss_config import clip_errors  # imports verl's config classes

    check_registered(config)
    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    errors = clip_errors(config.actor_rollout_ref.actor, clip_fields(loss_mode), loss_mode)
    settings = None
    if loss_mode in LOSSES:  # a row of the loss table: it reads RPGPolicyLossConfig
        settings = _rpg_policy_loss(config, policy_loss)
        if settings.spec.family == ADDON:  # the KL add-on: the clip fields its verl base reads
            base = settings.base_loss_mode
            errors += clip_errors(config.actor_rollout_ref.actor, VERL_CLIP_FIELDS.get(base, ()), base)
        errors += [msg for rule in RPG_RULES if (msg := rule(config, settings))]
    if errors:
        what = "RPG" if settings is not None else "policy-loss"
        raise RecipeConfigError(f"invalid {what} configuration:\n- " + "\n- ".join(errors))
    return settings
