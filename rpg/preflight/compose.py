"""Composing the recipes' config: `rpg/config/rpg_trainer.yaml` (verl 0.9.1's `ppo_trainer` + the settings every RPG
recipe shares) with Hydra overrides, in-process, and the error every pre-launch check raises."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

# The package's config folder (data, no __init__.py), addressed by path;
# rpg_trainer.yaml puts verl's `pkg://verl.trainer.config` on Hydra's search path itself.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
CONFIG_NAME = "rpg_trainer"


class RecipeConfigError(ValueError):
    """A recipe configuration that verl would accept (or reject only late, on the cluster) but that is wrong."""


POLICY_LOSS_PREFIX = "actor_rollout_ref.actor.policy_loss."


def _rpg_only_fields() -> frozenset:
    """The settings `RPGPolicyLossConfig` adds to verl's `PolicyLossConfig` (kl_coef, reference, ...): verl's yaml
    has no such key, and a recipe passes one only when it sets it (the defaults live in rpg/loss_config.py)."""
    from rpg.loss_config import RPGPolicyLossConfig
    from verl.workers.config import PolicyLossConfig

    return frozenset(f.name for f in dataclasses.fields(RPGPolicyLossConfig)) - {
        f.name for f in dataclasses.fields(PolicyLossConfig)
    }


def normalise_overrides(overrides: Sequence[str]) -> list[str]:
    """Rewrite `+key=value` to `++key=value` (add or override), and so a plain `actor_rollout_ref.actor.policy_loss.
    <setting>=value` of an RPG setting: it works whether or not the recipe passed that setting. (A misspelt setting is
    left alone for Hydra to reject.) Every other override is left untouched."""
    rpg_fields = _rpg_only_fields() if any(o.startswith(POLICY_LOSS_PREFIX) for o in overrides) else frozenset()

    def normalised(o: str) -> str:
        if o.startswith("+"):
            return o if o.startswith("++") else "+" + o
        key = o.partition("=")[0]
        return "++" + o if key.startswith(POLICY_LOSS_PREFIX) and key[len(POLICY_LOSS_PREFIX) :] in rpg_fields else o

    return [normalised(o) for o in overrides]


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """Compose `rpg_trainer` (verl's `ppo_trainer` + the recipes' shared settings) with `overrides`, in-process
    (Hydra's compose API, no run directory)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=normalise_overrides(overrides))


def _detached(node: DictConfig) -> DictConfig:
    """A resolved, parent-free copy of a config node (so interpolations into the rest of the tree still work)."""
    return OmegaConf.create(OmegaConf.to_container(node, resolve=True))
