"""Composing the recipes' config: `rpg/config/rpg_trainer.yaml` (verl 0.9.1's `ppo_trainer` + the settings every RPG
recipe shares) with Hydra overrides, in-process, and the error every pre-launch check raises."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue

from rpg.loss_options import option_names

# The package's config folder (data, no __init__.py), addressed by path;
# rpg_trainer.yaml puts verl's `pkg://verl.trainer.config` on Hydra's search path itself.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
CONFIG_NAME = "rpg_trainer"


class RecipeConfigError(ValueError):
    """A recipe configuration that verl would accept (or reject only late, on the cluster) but that is wrong."""


POLICY_LOSS_PREFIX = "actor_rollout_ref.actor.policy_loss."


def _rpg_only_fields() -> frozenset:
    """The settings `RPGPolicyLossConfig` adds to verl's `PolicyLossConfig` (kl_coef, reference, ...): verl's yaml
    has no such key, and a recipe passes one only when it sets it (the defaults live in rpg/loss_options.py)."""
    return frozenset(option_names())


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


# ------------------------------------------------------------------------------------------------------------------
# The recipes' derived values (one place): resolvers of rpg_trainer.yaml, evaluated by `finish` before any check
# ------------------------------------------------------------------------------------------------------------------
def _ktokens(ctx) -> int:
    """Context `ctx` in K tokens → tokens (paper App. H: max prompt = max response = ctx × 1024)."""
    return int(ctx) * 1024


def _token_budget(factor, prompt, response) -> int:
    """Per-GPU token budget of the dynamic batch size: factor × (prompt + response) (docs/differences.md#d14)."""
    return int(factor) * (int(prompt) + int(response))


def _quarter(response) -> int:
    """DAPO's overlong buffer: the last quarter of the response (docs/differences.md#s7-4)."""
    return int(response) // 4


def _data_files(folder, names) -> list:
    """`<folder>/<name>.parquet` for each name."""
    return [f"{folder}/{n}.parquet" for n in names]


def _checkout() -> str:
    """The folder that holds the `rpg` package (the repository in a checkout)."""
    return str(Path(__file__).resolve().parents[2])


RESOLVERS = {
    "rpg.checkout": _checkout,
    "rpg.ktokens": _ktokens,
    "rpg.token_budget": _token_budget,
    "rpg.quarter": _quarter,
    "rpg.data_files": _data_files,
}
for _name, _fn in RESOLVERS.items():
    OmegaConf.register_new_resolver(_name, _fn, replace=True)

RECIPE_NODE = "recipe"  # the recipe's own variables (ctx, divergence, β, ...): rpg_trainer.yaml, dropped by `finish`
#: Interpolations `finish` resolves in place: the recipe variables, the resolvers above, the environment.
_PINNED = (RECIPE_NODE + ".", "rpg.", "oc.env", "oc.decode")


def _literal(value):
    """`value` (a resolved value) as OmegaConf stores it literally: `${` in a string escaped (k backslashes before it
    become 2k + 1, OmegaConf 2.3's grammar), so a path such as '/d/${x}' stays that string."""
    if isinstance(value, str):
        return re.sub(r"(\\*)\$\{", lambda m: m[1] * 2 + "\\${", value)
    if isinstance(value, (list, tuple)):
        return [_literal(v) for v in value]
    if isinstance(value, dict):
        return {k: _literal(v) for k, v in value.items()}
    return value


def _resolved(value):
    """`value` with every interpolation resolved (a config node as a plain container)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _pin(node) -> None:
    keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
    for key in keys:
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)) and not OmegaConf.is_interpolation(node, key):
            _pin(node[key])
            continue
        raw = child._value()
        # a real interpolation that reads a pinned name (escaped `\${` is literal text, as in a path)
        live = re.sub(r"\\\$\{", "", raw) if isinstance(raw, str) else ""
        if "${" in live and any(token in live for token in _PINNED):
            try:
                value = _resolved(node[key])
            except (MissingMandatoryValue, InterpolationToMissingValueError):
                continue  # a `???` it reads: left for the checks, which name the missing key
            node[key] = _literal(value)  # the resolved value, read in this process


def finish(config: DictConfig) -> DictConfig:
    """The config verl receives, from a composed recipe: every value that reads the recipe variables, the resolvers
    above or the environment (`oc.env`) resolved here, in the launcher, before any Ray process starts (workers, other
    nodes and RAY_ADDRESS jobs see the values of the user's shell); the `recipe` node dropped; an RPG loss (decided by
    the loss table, `rpg.loss_table`), or a policy loss given RPG settings (kl_coef, reference, ...: the RPG rules
    then name what is wrong, e.g. a loss mode that is not in the table), gets its config class
    `rpg.RPGPolicyLossConfig`. Idempotent."""
    # deferred: the loss table imports torch (through rpg.divergences); this module's error class is imported early
    from rpg.loss_table import LOSSES, RPG_POLICY_LOSS_TARGETS

    _pin(config)
    with open_dict(config):
        config.pop(RECIPE_NODE, None)
    policy_loss = config.actor_rollout_ref.actor.policy_loss
    if str(policy_loss.loss_mode) in LOSSES or set(policy_loss.keys()) & _rpg_only_fields():
        if not str(policy_loss.get("_target_")).startswith("rpg."):  # verl's class, or none: RPG's public one
            policy_loss._target_ = RPG_POLICY_LOSS_TARGETS[0]
    return config


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """Compose `rpg_trainer` (verl's `ppo_trainer` + the recipes' shared settings + the chosen groups) with
    `overrides`, in-process (Hydra's compose API, no run directory), and `finish` it as the launcher does."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return finish(compose(config_name=CONFIG_NAME, overrides=normalise_overrides(overrides)))


def _detached(node: DictConfig) -> DictConfig:
    """A resolved, parent-free copy of a config node (so interpolations into the rest of the tree still work)."""
    return OmegaConf.create(OmegaConf.to_container(node, resolve=True))
