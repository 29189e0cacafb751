"""Helpers for the recipe tests: run a recipe script in the launcher's print mode (no Python start), compose its
overrides in-process as a dry run does (`rpg.launch.compose_config`) and validate them (`rpg.launch.validate`). Each
script is composed once per process (about 1 s each): the checks of every script live in one module,
test_dry_run_on_cpu.py, which parallel workers run whole (`--dist loadscope`). (Imported by the test modules of this
folder, which pytest puts on sys.path.)"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from rpg.tools import dry_run_digest as dd

# the environment without the knobs a developer may have exported (the tests see the scripts' own defaults)
clean_env = dd.recipe_env

REPO, RECIPE = dd.REPO, dd.RECIPE
SCRIPTS_7B = sorted((RECIPE / "7b").glob("*.sh"))
SCRIPTS_4B = sorted((RECIPE / "4b").glob("*.sh"))
SCRIPTS_1GPU = sorted((RECIPE / "1gpu").glob("run_*.sh"))  # the one-GPU LoRA rows (not the paper's setting)
SCRIPTS_CPU = sorted((RECIPE / "cpu").glob("run_*.sh"))


def run_script(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args], env=clean_env(**env), capture_output=True, text=True, timeout=300, cwd=REPO
    )


@functools.lru_cache(maxsize=None)
def printed(script: Path) -> dict:
    """The launcher's final argv/env as JSON (RPG_PRINT_ARGV=1; cached); fails the test if the script errors."""
    return dd.printed(script)


def overrides(script: Path) -> list[str]:
    return dd.launch_overrides(printed(script))


@functools.lru_cache(maxsize=None)
def composed(script: Path):
    """`rpg.launch.compose_config` of the script's overrides, as a dry run composes it (cached: once per process).
    Validating it changes nothing (the golden digests of test_dry_run_on_cpu.py would show it)."""
    from rpg.launch import compose_config

    return compose_config(overrides(script))


@functools.lru_cache(maxsize=None)
def validated(script: Path):
    """Every check of `rpg.launch.validate` on `composed(script)` (cached: once per process)."""
    from rpg.launch import validate

    return validate(composed(script))


def cfg_with(base, updates: dict | None = None, **keyword_updates):
    """A copy of the composed config `base` with `updates` (dotted key -> value) and `keyword_updates` (`__` stands
    for `.`) set; new keys are allowed."""
    import copy

    from omegaconf import OmegaConf, open_dict

    cfg = copy.deepcopy(base)
    dotted = {**(updates or {}), **{key.replace("__", "."): value for key, value in keyword_updates.items()}}
    with open_dict(cfg):
        for key, value in dotted.items():
            OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def as_launched(check, cfg, typed_from=None):
    """`check(cfg, policy_loss)` (`rpg.launch.validate_rpg`) with the typed `actor.policy_loss` built exactly as the
    launcher's `rpg.launch.validate` builds it: `build_verl_configs(cfg).actor.policy_loss`, after verl's own checks,
    so a field `RPGPolicyLossConfig` refuses is `build_verl_configs`'s RecipeConfigError, as in a launch. For the tests
    of one function's rules; a test of the whole validation calls `rpg.launch.compose_and_validate`.

    `typed_from`: the config to build it from instead of `cfg`, one with the same `actor.policy_loss`, for a rule of a
    setting that verl's own checks refuse first on this machine (a model folder needs its tokenizer): there the launcher reaches the rule on a machine that has them."""
    from rpg.launch import build_verl_configs

    typed = build_verl_configs(cfg if typed_from is None else typed_from).actor.policy_loss
    if typed_from is not None:
        assert typed_from.actor_rollout_ref.actor.policy_loss == cfg.actor_rollout_ref.actor.policy_loss
    return check(cfg, typed)


def refused(cfg, typed_from=None) -> str:
    """The message with which `rpg.launch.validate_rpg`, called as the launcher calls it (`as_launched`), refuses `cfg`
    (fails the test if it does not)."""
    import pytest

    from rpg.launch import RecipeConfigError, validate_rpg

    with pytest.raises(RecipeConfigError) as info:
        as_launched(validate_rpg, cfg, typed_from)
    return str(info.value)
