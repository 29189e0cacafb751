"""verl's own checks and dataclasses: build, before any Ray process starts, the typed configs verl's trainer and
workers build later (actor, reference, rollout, model, algorithm, checkpoint engine), type-check their scalar fields,
and run verl's `validate_config` exactly as `verl/trainer/main_ppo.py:main` does (on a machine without vLLM, a LoRA
rank is checked by `rpg.preflight.lora_rules` instead of verl's import of vLLM)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rpg.preflight.compose import RecipeConfigError, _detached
from rpg.preflight.lora_rules import config_for_verl_check


@dataclasses.dataclass
class ValidatedConfig:
    """The typed objects built from a config (what verl's trainer and workers would build)."""

    config: DictConfig
    actor: Any
    rollout: Any
    algorithm: Any
    checkpoint_engine: Any
    ref: Any = None
    model: Any = None  # HFModelConfig when the model path is a local directory, else None (checked structurally)
    rpg: Any = None  # RPGPolicyLossConfig for RPG losses
    path_problems: list = dataclasses.field(default_factory=list)  # check_paths: a dry run reports them
    install: tuple = ()  # rpg.install.selected: what every process of the run installs (RPG_INSTALL)


def _ref_as_worker_builds_it(config: DictConfig) -> DictConfig:
    """`actor_rollout_ref.ref` renamed exactly as `ActorRolloutRefWorker.init_model` does before building it."""
    ref = _detached(config.actor_rollout_ref.ref)
    with open_dict(ref):
        ref.ppo_mini_batch_size = config.actor_rollout_ref.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref


def _build_model(config: DictConfig):
    """HFModelConfig if the model is a local directory (loads tokenizer + HF config, as the workers do).

    A hub id (e.g. `Qwen/Qwen3-4B`) is not downloaded by a dry run: its keys and types are checked against
    the dataclass schema only.
    """
    from verl.workers.config import HFModelConfig

    from verl.utils.config import omega_conf_to_dataclass

    model = config.actor_rollout_ref.model
    if os.path.isdir(os.path.expanduser(str(model.path))):
        return omega_conf_to_dataclass(model)
    schema = {k: v for k, v in OmegaConf.to_container(model, resolve=True).items() if k != "_target_"}
    OmegaConf.merge(OmegaConf.structured(HFModelConfig), schema)
    return None


_SCALAR_TYPES = {float: (int, float), int: (int,), bool: (bool,), str: (str,)}


def _typecheck(obj: Any, key: str) -> Any:
    """Check the scalar fields of a built config dataclass (recursively) against their annotations.

    hydra's `instantiate` does not type-check, so e.g. `actor.clip_ratio_c=ten` would otherwise fail only inside the
    loss on the cluster. Only plain `float`/`int`/`bool`/`str` annotations are checked; None values are left to verl.
    """
    try:
        hints = typing.get_type_hints(type(obj))
    except Exception:  # noqa: BLE001 -- unresolvable annotations: nothing to check
        hints = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name, None)
        if dataclasses.is_dataclass(value):
            _typecheck(value, f"{key}.{f.name}")
            continue
        allowed = _SCALAR_TYPES.get(hints.get(f.name))
        if value is None or allowed is None:
            continue
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise RecipeConfigError(
                f"{key}.{f.name}={value!r} has type {type(value).__name__}; expected {hints[f.name].__name__}"
            )
    return obj


def _rpg_refusal(build, node):
    """`build(node)`; a ValueError of the RPG options' own validation (`RPGPolicyLossConfig.__post_init__`, raised
    inside Hydra's instantiate: a field's value, an option without effect, the top-k KL's limits) becomes the project's
    refusal, a `RecipeConfigError` naming the config node."""
    try:
        return build(node)
    except Exception as error:
        cause = error if isinstance(error, ValueError) else error.__cause__
        # its own message names it, or Hydra's does ("Error in call to target 'rpg.loss_config.RPGPolicyLossConfig'")
        if isinstance(cause, ValueError) and "RPGPolicyLossConfig" in str(error):
            node_name = "actor_rollout_ref.actor.policy_loss"
            said = str(cause)  # named once: many of the options' messages start with the node already
            raise RecipeConfigError(said if said.startswith(node_name) else f"{node_name}: {said}") from error
        raise


def build_verl_configs(config: DictConfig) -> ValidatedConfig:
    """Build the dataclasses verl's workers build (type-checked), then run verl's `validate_config` as
    `main_ppo.main` does.

    The typed builds come first so that a value of the wrong type is named (e.g. `rollout.temperature='hot'`) instead
    of failing inside one of `validate_config`'s comparisons. Otherwise raises whatever verl raises (AssertionError,
    ValueError, hydra InstantiationException, OmegaConf errors) with verl's own message; nothing here starts Ray or
    touches a GPU.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    use_ref = need_reference_policy(config)
    arr = config.actor_rollout_ref
    ref = omega_conf_to_dataclass(_ref_as_worker_builds_it(config)) if use_ref else None
    validated = ValidatedConfig(
        config=config,
        actor=_typecheck(_rpg_refusal(omega_conf_to_dataclass, arr.actor), "actor_rollout_ref.actor"),
        ref=_typecheck(ref, "actor_rollout_ref.ref") if use_ref else None,
        rollout=_typecheck(omega_conf_to_dataclass(arr.rollout), "actor_rollout_ref.rollout"),
        model=_build_model(config),
        algorithm=omega_conf_to_dataclass(config.algorithm),
        checkpoint_engine=omega_conf_to_dataclass(arr.rollout.checkpoint_engine),
    )
    verl_view = config_for_verl_check(config)  # a LoRA rank checked by RPG where vLLM is not importable (lora_rules)
    with contextlib.redirect_stdout(sys.stderr):  # verl prints progress; keep stdout for the YAML of a dry run
        validate_config(config=verl_view, use_reference_policy=use_ref, use_critic=need_critic(config))
    return validated
