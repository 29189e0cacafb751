"""`validate`: every check of a composed config before Ray starts (verl's own, the dataclass builds, the recipe rules, the
RPG rules, what the run installs), returning the typed config (`ValidatedConfig`) that every later step reads: the
dry-run summary, the disk estimate, the memory plan, the smoke run, the doctor. `rpg.launch` re-exports both names.
"""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig

from rpg import install
from rpg.preflight.compose import RecipeConfigError, compose_config
from rpg.preflight.inputs import check_paths
from rpg.preflight.lora_rules import validate_lora
from rpg.preflight.prompts import prompt_length_problems
from rpg.preflight.recipe_rules import validate_recipe
from rpg.preflight.rpg_rules import validate_rpg
from rpg.preflight.verl_configs import ValidatedConfig, build_verl_configs

__all__ = ["compose_and_validate", "validate"]


def validate(config: DictConfig, *, real_launch: bool = False) -> ValidatedConfig:
    """All checks on a composed config: the LoRA rules, verl's, the dataclass builds, the recipe rules and the RPG
    rules.

    Local paths that do not exist (`check_paths`) are returned in `path_problems` (a dry run reports them), or raised
    with `real_launch=True`.
    """
    # deferred: both import verl's trainer modules (ray, torch), which a launch imports only after these checks
    from rpg.dynamic_sampling import check_config as check_dynamic_sampling
    from rpg.schedule_free import check_config as check_schedule_free

    validate_lora(config)  # the adapter's rank vLLM serves, LoRA not with separate_async (verl #7495)
    validated = build_verl_configs(config)
    validated.path_problems = check_paths(config)
    if real_launch and validated.path_problems:
        raise RecipeConfigError("missing input:\n- " + "\n- ".join(validated.path_problems))
    validate_recipe(config)
    if problems := prompt_length_problems(config):
        raise RecipeConfigError("prompts longer than the configured length:\n- " + "\n- ".join(problems))
    policy_loss = validated.actor.policy_loss  # built once, with the actor: every check reads this object
    validated.rpg = validate_rpg(config, policy_loss)
    check_schedule_free(config)  # optimizer and trainer agree (schedule-free needs its trainer mode, and only it)
    validated.install = install.selected(config, policy_loss)
    try:  # what the run installs in every process (rpg.install): an unsupported verl fails here, before Ray
        install.check(validated.install)
    except RuntimeError as e:
        raise RecipeConfigError(f"invalid RPG configuration:\n- {e}") from None
    check_dynamic_sampling(config)  # max_num_gen_batches reaches a sampler that bounds the step
    return validated


def compose_and_validate(overrides: Sequence[str]) -> ValidatedConfig:
    """Compose verl's config with `overrides` and run every check, in-process (no Ray). For tests and tools."""
    return validate(compose_config(overrides))
