"""The launcher's first checks, before verl is imported (importing it takes about 6 s): `python -m rpg.launch --help`,
this interpreter's verl, and the names in the raw Hydra overrides (`policy_loss.loss_mode`, `algorithm.adv_estimator`,
the `policy_loss.*` options), each refused with the closest valid names and `--list`.

Imports only the standard library and `rpg.loss_options` at module level (the loss table and the advantage
estimators, inside functions), none of which imports verl. The RPG names are read from their sources: the options are
the fields of `rpg.loss_options.RPGOptions`, which `rpg.RPGPolicyLossConfig` is built from. verl's own names are listed
here for verl 0.9.1; tests/test_launcher_messages_on_cpu.py checks that they equal verl's registries and config
fields, and that the RPG names equal the ones the plugin registers.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from typing import Iterable, Optional, Sequence

from rpg.loss_options import option_names

POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"
LOSS_MODE_KEY = f"{POLICY_LOSS_KEY}.loss_mode"
ADV_ESTIMATOR_KEY = "algorithm.adv_estimator"

# verl 0.9.1: `verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY` and `ADV_ESTIMATOR_REGISTRY` without RPG's names, and
# the fields of `verl.workers.config.PolicyLossConfig`.
VERL_POLICY_LOSSES = (
    "bypass_mode", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gpg", "gspo", "kl_cov", "sapo",
    "vanilla",
)
VERL_ADV_ESTIMATORS = (
    "gae", "gdpo", "gpg", "grpo", "grpo_passk", "grpo_vectorized", "opo", "optimal_token_baseline",
    "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "rloo_vectorized",
    "tir_optimal_token_baseline",
)
VERL_POLICY_LOSS_FIELDS = (
    "_target_", "loss_mode", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta",
    "rollout_correction",
)

LIST_HINT = "python -m rpg.launch --list"

HELP = f"""\
usage: python -m rpg.launch [HYDRA OVERRIDES...]     (what every recipe script runs: bash recipe/rpg/<dir>/run_*.sh)

Composes rpg/config/rpg_trainer.yaml (verl 0.9.1's ppo_trainer + the RPG recipes' shared settings) with the
overrides, checks everything verl would reject later on the cluster (typed configs, the RPG loss rules, recipe
rules, local paths, prompt lengths, the GPU memory plan), then runs verl's main_ppo.

Modes (environment variables; the same for a recipe script):
  (none)              check, then train (a local Ray, or the cluster at RAY_ADDRESS)
  RPG_DRY_RUN=1       check, print the resolved config as YAML and a summary; no Ray, no GPU, a few seconds
  RPG_DRY_RUN=summary the same, printing only the summary (every refusal of a real launch in it)
  SMOKE=1             the recipe for 2 steps on its smallest full batch, then time per phase, peak memory and the
                      projected wall time (docs/gpu.md#smoke); with RPG_DRY_RUN=1 prints the smoke config
  RPG_PRINT_ARGV=1    (recipe scripts) print the final command and environment as JSON, import nothing

Flags:
  --list [--markdown] the RPG policy losses (loss_mode, family, divergence, options) and verl's own names
  --help-config       Hydra's help: every config group and the full default config (about 1,100 lines)
  -h, --help          this page

Key settings (Hydra keys; defaults in the recipe's config groups, rpg/config/):
  actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_urkl   (python -m rpg.launch --list)
  actor_rollout_ref.actor.policy_loss.kl_coef=1e-4                  (β; kl_control=adaptive: β follows kl_target)
  actor_rollout_ref.actor.policy_loss.reference=iterative           (iterative | frozen | periodic | ema)
  actor_rollout_ref.actor.policy_loss.base_loss_mode=gspo           (the verl loss under rpg_kl_<div>)
  algorithm.adv_estimator=rpg, actor_rollout_ref.actor.clip_ratio_low / clip_ratio_high / clip_ratio_c (c = 10)
  actor_rollout_ref.actor.optim.lr=1e-6, data.max_prompt_length, data.max_response_length
  Environment knobs (recipe/rpg/README.md): MODEL_PATH TRAIN_FILE TEST_FILE CKPTS_DIR N_GPUS NNODES ...

Overrides: key=value sets a key of verl's config; +key=value adds a key (treated as ++: add or override); RPG's
policy_loss options work with or without the +. On a recipe script, put them after the script name: they come last,
so they win over the script's settings. A former script knob exported in the shell (LR, KL_COEF, CLIP_LOW, CTX, ...)
is refused, naming the override to pass instead (recipe/rpg/README.md#exported-knob-rule):
  RPG_DRY_RUN=1 bash recipe/rpg/4b/run_rpg_reinforce_urkl_4k.sh actor_rollout_ref.actor.policy_loss.kl_coef=1e-3

Environments: GPU runs use python3 of the GPU environment (docs/gpu.md); the CPU profile (RPG_PROFILE=cpu) the
repository's .venv (scripts/setup_env.sh). Docs: docs/losses.md (the losses), docs/gpu.md (install, memory plan).
"""


def _closest(value: str, names: Iterable[str], n: int = 3) -> list[str]:
    """The `n` names closest to `value` (difflib's ratio), closest first."""
    return difflib.get_close_matches(value, sorted(set(names)), n=n, cutoff=0.0)


def _did_you_mean(value: str, names: Iterable[str]) -> str:
    return "did you mean " + " or ".join(repr(c) for c in _closest(value, names)) + "?"


def rpg_adv_estimators() -> tuple[str, ...]:
    """RPG's advantage estimators (`rpg.advantages.ADVANTAGE_ESTIMATORS`, which imports verl only when one runs)."""
    from rpg.advantages import ADVANTAGE_ESTIMATORS  # deferred: this module runs before verl is imported (above)

    return tuple(ADVANTAGE_ESTIMATORS)


def policy_loss_names() -> tuple[str, ...]:
    """Every valid `policy_loss.loss_mode`: the loss table's rows, then verl's own losses."""
    from rpg.loss_table import LOSSES  # deferred: the loss table imports torch, this module only the standard library

    return (*LOSSES, *VERL_POLICY_LOSSES)


def _key_value(override: str) -> Optional[tuple[str, str]]:
    """(key, value) of a `key=value`, `+key=value` or `++key=value` override; None for a deletion (`~key`) or a value
    OmegaConf resolves later (`${...}`), which the full checks see."""
    key, sep, value = override.lstrip("+").partition("=")
    if not sep or override.startswith("~") or "${" in value:
        return None
    return key.strip(), value.strip().strip("'\"")


def check_overrides(overrides: Sequence[str]) -> list[str]:
    """The problems of the raw overrides' loss_mode, adv_estimator and policy_loss.* keys (empty: none)."""
    problems = []
    rpg_options = option_names()
    options = (*VERL_POLICY_LOSS_FIELDS, *rpg_options)
    for override in overrides:
        kv = _key_value(override)
        if kv is None:
            continue
        key, value = kv
        if key == LOSS_MODE_KEY and value not in policy_loss_names():
            problems.append(
                f"{LOSS_MODE_KEY}={value!r} is not a policy loss; {_did_you_mean(value, policy_loss_names())} "
                f"All names: {LIST_HINT}"
            )
        elif key == ADV_ESTIMATOR_KEY and value not in (*rpg_adv_estimators(), *VERL_ADV_ESTIMATORS):
            names = (*rpg_adv_estimators(), *VERL_ADV_ESTIMATORS)
            problems.append(
                f"{ADV_ESTIMATOR_KEY}={value!r} is not an advantage estimator; {_did_you_mean(value, names)} "
                f"Valid: RPG's {', '.join(rpg_adv_estimators())}; verl's {', '.join(VERL_ADV_ESTIMATORS)} ({LIST_HINT})"
            )
        elif key.startswith(POLICY_LOSS_KEY + "."):
            option = key[len(POLICY_LOSS_KEY) + 1 :].split(".")[0]
            if option not in options:
                problems.append(
                    f"{key}: {option!r} is not an option of the RPG losses or of verl's PolicyLossConfig; "
                    f"{_did_you_mean(option, options)} RPG's options: {', '.join(rpg_options)} (which loss reads "
                    f"which: {LIST_HINT})"
                )
    return problems


def verl_problem(find_spec=importlib.util.find_spec) -> Optional[str]:
    """Why this interpreter cannot run the launcher (no verl), with the fix; None if it can."""
    missing = [m for m in ("verl", "hydra", "omegaconf") if find_spec(m) is None]
    if not missing:
        return None
    return (
        f"{sys.executable} cannot import {', '.join(missing)}: it is not the environment rpg-verl runs in. The GPU "
        f"recipes run `python3`, which must be the GPU environment's (docs/gpu.md: `source .venv-gpu/bin/activate`). "
        f"Or name the interpreter: PYTHON=/path/to/python bash recipe/rpg/...; a dry run (RPG_DRY_RUN=1) launches "
        f"nothing and works with the CPU environment too: PYTHON=.venv/bin/python RPG_DRY_RUN=1 bash "
        f"recipe/rpg/... (made by scripts/setup_env.sh)"
    )


def list_text() -> str:
    """`--list`'s lines after the loss table: verl's own names, valid too."""
    return (
        f"\nverl's own policy losses (loss_mode): {', '.join(VERL_POLICY_LOSSES)}\n"
        f"advantage estimators (algorithm.adv_estimator): RPG's {', '.join(rpg_adv_estimators())}; "
        f"verl's {', '.join(VERL_ADV_ESTIMATORS)}\n"
    )
