"""`python -m rpg.launch <hydra overrides>`: verl 0.9.1's PPO entry point with every check done up front.

The recipe launcher (`recipe/rpg/common.sh`) runs this module instead of `python -m verl.trainer.main_ppo`. It is a
thin Hydra entry over the package's `rpg/config/rpg_trainer.yaml`: verl's own `ppo_trainer` config (from the installed
`verl.trainer.config` package, so every key and default is verl's) plus the settings all RPG recipes share. Before
any Ray process starts, it

1. builds the typed config dataclasses that verl's trainer and workers build later (actor, reference, rollout,
   model, algorithm, reward manager, checkpoint engine), so a misspelt `+key` or a bad value fails here instead of
   minutes later inside a worker on the cluster;
2. runs verl's `validate_config` exactly as `verl/trainer/main_ppo.py:main` does;
3. checks the recipe-level rules verl cannot know about (`validate_rpg`, `validate_recipe`: among them the context
   length against the model, run names, and a scorer for every data source and ground truth of the local data);
4. checks that every local path exists (`check_paths`: model, data files, resume path): a dry run reports a missing
   one on stderr, a real launch refuses it;
5. then either prints the resolved config as YAML and exits (`RPG_DRY_RUN=1`, no Ray, a few seconds) or hands the
   config unchanged to verl's `run_ppo` with verl's own TaskRunner (v1, or the legacy one if `trainer.use_v1=False`).

`+key=value` overrides are treated as `++key=value` (add or override), so a key added by `common.sh` or the yaml (e.g.
`+actor_rollout_ref.actor.policy_loss.kl_coef`) can be set again by a script or on the command line; the RPG settings
of `policy_loss` (kl_coef, reference, ...) may be given with or without the `+`.

For tests and tools, `compose_config(overrides)` and `compose_and_validate(overrides)` do steps 1–4 in-process (paths
reported in `ValidatedConfig.path_problems`, as in a dry run). `python -m rpg.launch --list` prints the loss table
(`--list --markdown`: the README's table).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import json
import os
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

# A folder next to the `rpg.config` module, so addressed by path (a `pkg://rpg.config` would name the module);
# rpg_trainer.yaml puts verl's `pkg://verl.trainer.config` on Hydra's search path itself.
CONFIG_DIR = Path(__file__).resolve().parent / "config"
CONFIG_NAME = "rpg_trainer"
RPG_POLICY_LOSS_TARGETS = ("rpg.RPGPolicyLossConfig", "rpg.config.RPGPolicyLossConfig")
OVERLONG_BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")
DRY_RUN_ENV = "RPG_DRY_RUN"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


class RecipeConfigError(ValueError):
    """A recipe configuration that verl would accept (or reject only late, on the cluster) but that is wrong."""


def is_rpg_loss(loss_mode: str) -> bool:
    """True for the plugin's losses, the rows of the loss table `rpg.losses.LOSSES` (they read RPGPolicyLossConfig)."""
    from rpg.losses import is_rpg_loss as in_loss_table

    return in_loss_table(loss_mode)


# --------------------------------------------------------------------------------------------------------------
# Composition
# --------------------------------------------------------------------------------------------------------------
POLICY_LOSS_PREFIX = "actor_rollout_ref.actor.policy_loss."


def _rpg_only_fields() -> frozenset:
    """The settings `RPGPolicyLossConfig` adds to verl's `PolicyLossConfig` (kl_coef, reference, ...): verl's yaml
    has no such key, and a recipe passes one only when it sets it (the defaults live in rpg/config.py)."""
    from rpg.config import RPGPolicyLossConfig
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


# --------------------------------------------------------------------------------------------------------------
# verl's own checks and dataclasses
# --------------------------------------------------------------------------------------------------------------
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


def _detached(node: DictConfig) -> DictConfig:
    """A resolved, parent-free copy of a config node (so interpolations into the rest of the tree still work)."""
    return OmegaConf.create(OmegaConf.to_container(node, resolve=True))


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
        actor=_typecheck(omega_conf_to_dataclass(arr.actor), "actor_rollout_ref.actor"),
        ref=_typecheck(ref, "actor_rollout_ref.ref") if use_ref else None,
        rollout=_typecheck(omega_conf_to_dataclass(arr.rollout), "actor_rollout_ref.rollout"),
        model=_build_model(config),
        algorithm=omega_conf_to_dataclass(config.algorithm),
        checkpoint_engine=omega_conf_to_dataclass(arr.rollout.checkpoint_engine),
    )
    with contextlib.redirect_stdout(sys.stderr):  # verl prints progress; keep stdout for the YAML of a dry run
        validate_config(config=config, use_reference_policy=use_ref, use_critic=need_critic(config))
    return validated


# --------------------------------------------------------------------------------------------------------------
# RPG rules
# --------------------------------------------------------------------------------------------------------------
def _registries():
    import verl  # noqa: F401  (loads the `verl.plugins` entry points, i.e. registers the RPG losses/estimators)

    # verl swallows plugin import errors; import the plugin explicitly so a broken plugin fails loudly here (and a
    # registration skipped because `rpg.config` was mid-import when verl loaded its plugins happens now).
    import rpg.verl_plugin  # noqa: F401
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    return POLICY_LOSS_REGISTRY, ADV_ESTIMATOR_REGISTRY


def check_registered(config: DictConfig) -> None:
    """`policy_loss.loss_mode` and `algorithm.adv_estimator` must be names in verl's registries."""
    losses, estimators = _registries()
    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    if loss_mode not in losses:
        rpg_names = sorted(n for n in losses if is_rpg_loss(n))
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is not a registered policy loss. "
            f"RPG losses: {rpg_names or '(none registered: is the rpg plugin installed?)'}; "
            f"verl built-ins: {sorted(n for n in losses if not is_rpg_loss(n))}"
        )
    adv = config.algorithm.adv_estimator
    if adv not in estimators:
        raise RecipeConfigError(
            f"algorithm.adv_estimator={adv!r} is not a registered advantage estimator; valid: {sorted(estimators)}"
        )


def _rpg_policy_loss(config: DictConfig):
    """Instantiate `actor.policy_loss` as `RPGPolicyLossConfig` (its __post_init__ validates every field against the
    loss table and installs what the run needs from verl, failing here if this verl is not supported)."""
    from hydra.errors import InstantiationException

    from rpg.config import RPGPolicyLossConfig
    from verl.utils.config import omega_conf_to_dataclass

    policy_loss = config.actor_rollout_ref.actor.policy_loss
    target = policy_loss.get("_target_")
    if target not in RPG_POLICY_LOSS_TARGETS:
        raise RecipeConfigError(
            f"loss_mode={policy_loss.loss_mode!r} reads the RPG settings, but actor_rollout_ref.actor.policy_loss."
            f"_target_={target!r}; add the override "
            f"actor_rollout_ref.actor.policy_loss._target_={RPG_POLICY_LOSS_TARGETS[0]}"
        )
    try:
        settings = omega_conf_to_dataclass(_detached(policy_loss))
    except InstantiationException as e:  # hydra wraps the config's own ValueError/RuntimeError: show that one
        cause = e.__cause__ or e
        raise RecipeConfigError(f"invalid RPG configuration:\n- {cause}") from e
    assert isinstance(settings, RPGPolicyLossConfig), type(settings)
    return settings


def _rule_bypass(config: DictConfig, settings) -> Optional[str]:
    from rpg.config import bypass_error

    return bypass_error(config.algorithm.get("rollout_correction", None))


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


RPG_RULES: tuple[Callable[[DictConfig, Any], Optional[str]], ...] = (
    _rule_bypass,
    _rule_no_kl_in_reward,
    _rule_reference_model,
)


def validate_rpg(config: DictConfig):
    """Check the loss rules on a composed config; return the `RPGPolicyLossConfig` (None for verl's own losses).

    The loss table (`rpg.losses.LOSSES`, `python -m rpg.launch --list`) drives them. All violations are reported
    together:
    * `loss_mode` and `adv_estimator` are registered (the valid names are listed on error);
    * every clip field the loss reads (its table row, or verl's vanilla/gspo/cispo) is usable: ε1 ∈ (0, 1),
      ε2 > 0, c > 1 (verl itself checks c only inside the loss, at the first update);
    * RPG loss ⇒ `policy_loss._target_` is `rpg.RPGPolicyLossConfig` and its fields are valid, including that no
      option is set that cannot change this loss or reference mode (`rpg.config.ineffective_options`);
    * RPG loss ⇒ `algorithm.rollout_correction.bypass_mode=False` (rpg.config.BYPASS_ERROR);
    * RPG loss ⇒ `algorithm.use_kl_in_reward=False` (docs/differences.md#d2);
    * `reference=iterative` ⇒ no verl KL loss with a non-zero coefficient (it would be a second KL);
    * `reference` frozen/periodic, or a loss that needs a reference (`grpo_wk3`) ⇒ `use_kl_loss=True` and
      `kl_loss_coef=0` (verl builds the reference model and ships `ref_log_prob`, but adds nothing itself);
    * building the RPG config installs the `ref_log_prob` adapter (and for `periodic` the worker hooks) when the
      settings need them: on a verl version or signature they were not written for, that fails here, naming both.
    """
    from rpg.config import clip_errors
    from rpg.losses import clip_fields

    check_registered(config)
    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    errors = clip_errors(config.actor_rollout_ref.actor, clip_fields(loss_mode), loss_mode)
    settings = None
    if is_rpg_loss(loss_mode):
        settings = _rpg_policy_loss(config)
        errors += [msg for rule in RPG_RULES if (msg := rule(config, settings))]
    if errors:
        what = "RPG" if settings is not None else "policy-loss"
        raise RecipeConfigError(f"invalid {what} configuration:\n- " + "\n- ".join(errors))
    return settings


# --------------------------------------------------------------------------------------------------------------
# Recipe rules that are not RPG-specific (verl would fail late or silently ignore the setting)
# --------------------------------------------------------------------------------------------------------------
def _rule_filter_groups_needs_v1(config: DictConfig) -> Optional[str]:
    fg = config.algorithm.get("filter_groups", None) or {}
    if fg.get("enable", False) and not config.trainer.use_v1:
        return (
            "algorithm.filter_groups.enable=True needs the v1 trainer (trainer.use_v1=True): verl 0.9.1's legacy "
            "trainer has no dynamic sampling and would silently train without it."
        )
    return None


def _rule_overlong_buffer(config: DictConfig) -> Optional[str]:
    kwargs = config.reward.get("reward_kwargs", None) or {}
    buf = kwargs.get("overlong_buffer_cfg", None)
    if buf is None:
        return None
    unknown = sorted(set(buf.keys()) - set(OVERLONG_BUFFER_KEYS))
    if unknown:
        valid = list(OVERLONG_BUFFER_KEYS)
        return f"reward.reward_kwargs.overlong_buffer_cfg has unknown keys {unknown}; valid: {valid}"
    if not buf.get("enable", False):
        return None
    if config.reward.reward_manager.name != "dapo":
        return (
            f"reward.reward_kwargs.overlong_buffer_cfg.enable=True is only read by the 'dapo' reward manager, "
            f"but reward.reward_manager.name={config.reward.reward_manager.name!r}"
        )
    max_resp, length = kwargs.get("max_resp_len", None), buf.get("len", None)
    if max_resp != config.data.max_response_length:
        return (
            f"reward.reward_kwargs.max_resp_len={max_resp} must equal data.max_response_length="
            f"{config.data.max_response_length} (the DAPO overlong penalty is measured from it, "
            "docs/differences.md#s7-4)"
        )
    if not (isinstance(length, int) and 0 < length <= max_resp):
        return (
            f"reward.reward_kwargs.overlong_buffer_cfg.len={length!r} must be an integer in "
            f"(0, max_resp_len={max_resp}]"
        )
    return None


def _rule_reward_manager(config: DictConfig) -> Optional[str]:
    # verl 0.9.1's RewardManagerConfig cannot be instantiated (its __post_init__ calls a missing super method), so
    # its registration check is repeated here: the reward loop would otherwise fail only inside a Ray worker.
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    manager = config.reward.reward_manager
    if manager.source == "register" and manager.name not in REWARD_MANAGER:
        valid = sorted(REWARD_MANAGER)
        return f"reward.reward_manager.name={manager.name!r} is not a registered reward manager; valid: {valid}"
    if manager.source not in ("register", "importlib"):
        return f"reward.reward_manager.source={manager.source!r} is not valid; choose 'register' or 'importlib'"
    return None


def _rule_custom_reward_fn(config: DictConfig) -> Optional[str]:
    fn = config.reward.get("custom_reward_function", None) or {}
    if not fn.get("path"):
        return None
    from verl.utils.import_utils import load_extern_object

    try:  # the same loader the reward workers use
        obj = load_extern_object(module_path=fn.path, object_name=fn.name)
    except Exception as e:  # noqa: BLE001 -- report any loader failure with the offending keys
        return f"reward.custom_reward_function path={fn.path!r} name={fn.name!r} cannot be loaded: {e}"
    return None if callable(obj) else f"reward.custom_reward_function {fn.path}:{fn.name} is not callable"


# --------------------------------------------------------------------------------------------------------------
# Launch inputs: local paths, context length, run names, data sources and ground truths
# --------------------------------------------------------------------------------------------------------------
#: The recipe knob (environment variable of recipe/rpg/common.sh) that sets a key; messages name both.
RECIPE_KNOBS = {
    "actor_rollout_ref.model.path": "MODEL_PATH",
    "data.train_files": "TRAIN_FILE",
    "data.val_files": "TEST_FILE",
    "data.max_prompt_length": "PROMPT_LEN, default CTX*1024",
    "data.max_response_length": "RESPONSE_LEN, default CTX*1024",
    "trainer.project_name": "PROJECT_NAME",
    "trainer.experiment_name": "EXP_NAME",
    "data.apply_chat_template_kwargs.enable_thinking": "THINKING, Qwen3-4B scripts",
}
RESUME_MODES = ("auto", "disable", "resume_path")  # verl 0.9.1 `_load_checkpoint`
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # hdfs://, s3://, hf://...: fetched by verl or fsspec, not checked


def _knob(key: str) -> str:
    return f" (recipe knob {RECIPE_KNOBS[key]})" if key in RECIPE_KNOBS else ""


def _paths(config: DictConfig, key: str) -> list[str]:
    """The path or paths at `key` (verl takes one or a list)."""
    value = OmegaConf.select(config, key)
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, ListConfig | list | tuple) else [str(value)]


def _local_files(path: str) -> Optional[list[str]]:
    """The local files `path` names: itself if it exists, else the matches of a glob (`datasets` expands data-file
    globs); None for a URL."""
    if _URL.match(path):
        return None
    if os.path.exists(path):
        return [path]
    return sorted(glob.glob(path)) if glob.has_magic(path) else []


def _model_location(path: str) -> str:
    """'local', 'hub', 'url' or 'missing', decided as transformers decides (`transformers.utils.hub.cached_files`):
    an existing directory is a local model; anything else is read as a hub repo id, which must pass huggingface_hub's
    `validate_repo_id` (`Qwen/Qwen3-4B` does, `/models/x`, `./x` and `~/x` do not: those are local paths)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if _URL.match(path):
        return "url"
    if os.path.isdir(path):
        return "local"
    try:
        validate_repo_id(path)
    except HFValidationError:
        return "missing"
    return "hub"


def _rule_model_path(config: DictConfig) -> Optional[str]:
    key = "actor_rollout_ref.model.path"
    path = str(OmegaConf.select(config, key))
    if _model_location(path) != "missing":
        return None
    tilde = " (nothing expands `~` after the shell: write the full path)" if path.startswith("~") else ""
    return (
        f"{key}={path!r}{_knob(key)} does not exist: it is no local directory, and not a Hugging Face hub id "
        f"either{tilde}. Fix: point MODEL_PATH at the model directory (with its config.json) or give a hub id such "
        f"as Qwen/Qwen3-4B."
    )


def _missing_data_files(config: DictConfig, key: str) -> Optional[str]:
    missing = [p for p in _paths(config, key) if _local_files(p) == []]
    if not missing:
        return None
    listed = ", ".join(f"{p!r} {'matches no file' if glob.has_magic(p) else 'does not exist'}" for p in missing)
    several = (
        " A value with spaces is one path: give several files one per line, or as a Hydra list "
        "\"['a.parquet','b.parquet']\"."
        if any(" " in p for p in missing)
        else ""
    )
    return (
        f"{key}{_knob(key)}: {listed}. Fix: point {RECIPE_KNOBS[key]} at existing parquet files (the recipes "
        f"default to DATA_DIR/<name>.parquet).{several}"
    )


def _rule_train_files(config: DictConfig) -> Optional[str]:
    return _missing_data_files(config, "data.train_files")


def _rule_val_files(config: DictConfig) -> Optional[str]:
    return _missing_data_files(config, "data.val_files")


def _rule_resume_path_exists(config: DictConfig) -> Optional[str]:
    path = config.trainer.get("resume_from_path", None)
    if config.trainer.resume_mode != "resume_path" or path is None or _local_files(str(path)) != []:
        return None
    return (
        f"trainer.resume_from_path={str(path)!r} does not exist (trainer.resume_mode=resume_path). Fix: give an "
        f"existing checkpoint directory .../global_step_<N>, or trainer.resume_mode=auto to resume from the latest "
        f"one under trainer.default_local_dir."
    )


#: Local paths that must exist: a dry run reports a missing one, a real launch refuses it.
PATH_RULES: tuple[Callable[[DictConfig], Optional[str]], ...] = (
    _rule_model_path,
    _rule_train_files,
    _rule_val_files,
    _rule_resume_path_exists,
)


def check_paths(config: DictConfig) -> list[str]:
    """The PATH_RULES violations: local paths (model, each train/val file, resume path) that do not exist."""
    return [msg for rule in PATH_RULES if (msg := rule(config))]


def _rule_resume_settings(config: DictConfig) -> Optional[str]:
    mode, path = config.trainer.resume_mode, config.trainer.get("resume_from_path", None)
    if mode not in RESUME_MODES:
        return f"trainer.resume_mode={mode!r} is not valid; choose one of: {', '.join(RESUME_MODES)}"
    if mode == "resume_path" and not re.search(r"global_step_\d+$", str(path)):
        return (
            f"trainer.resume_from_path={path!r} with trainer.resume_mode=resume_path: verl reads the step from the "
            f"path, which must end in global_step_<N> (no trailing '/'). Fix: give that checkpoint directory."
        )
    return None


def _rule_run_names(config: DictConfig) -> Optional[str]:
    bad = []
    for key in ("trainer.project_name", "trainer.experiment_name"):
        name = str(OmegaConf.select(config, key))
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            bad.append(f"{key}={name!r}{_knob(key)}")
    if not bad:
        return None
    return (
        f"{' and '.join(bad)}: a run name must be one path component (not empty, no '/', not '.' or '..'), as it "
        f"names the directories <project>/<experiment> under the checkpoint and log roots and would escape them. "
        f"Fix: a plain name such as rpg-verl or urkl-4k-run2."
    )


def _model_config_file(path: str) -> Optional[str]:
    """config.json of a local model, or of a hub model already in the local Hugging Face cache (never downloads)."""
    location = _model_location(path)
    if location == "local":
        file = os.path.join(path, "config.json")
        return file if os.path.isfile(file) else None
    if location == "hub":
        from huggingface_hub import try_to_load_from_cache

        file = try_to_load_from_cache(path, "config.json")
        return file if isinstance(file, str) else None
    return None


def _rule_context_fits_model(config: DictConfig) -> Optional[str]:
    model = config.actor_rollout_ref.model
    file = _model_config_file(str(model.get("hf_config_path", None) or model.path))
    if file is None:
        return None
    with open(file) as f:
        hf = json.load(f)
    hf.update(OmegaConf.to_container(model.get("override_config", None) or OmegaConf.create(), resolve=True))
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return None  # scaled RoPE: the inference engine derives the usable length by its own rules
    limit = hf.get("max_position_embeddings") or (hf.get("text_config") or {}).get("max_position_embeddings")
    prompt, response = config.data.max_prompt_length, config.data.max_response_length
    if not isinstance(limit, int) or prompt + response <= limit:
        return None
    return (
        f"data.max_prompt_length{_knob('data.max_prompt_length')} + data.max_response_length"
        f"{_knob('data.max_response_length')} = {prompt} + {response} = {prompt + response} exceeds the model's "
        f"max_position_embeddings={limit} ({file}). Fix: lower them to at most {limit} in total, or use a model "
        f"with a longer context."
    )


def _configured_scorer(config: DictConfig):
    """(name, has_scorer, owns_ground_truths) of the score function the reward manager will call, or None when it is
    a user's own function (not second-guessed) or a custom reward manager."""
    from rpg.data import reward

    if config.reward.reward_manager.get("source", "register") != "register":
        return None
    fn = config.reward.get("custom_reward_function", None) or {}
    if not fn.get("path"):
        return "verl's default_compute_score", reward.verl_has_scorer, False
    from verl.utils.import_utils import load_extern_object

    try:
        obj = load_extern_object(module_path=fn.path, object_name=fn.name)
    except Exception:  # noqa: BLE001 -- _rule_custom_reward_fn reports it
        return None
    return (f"{fn.path}:{fn.name}", reward.has_scorer, True) if obj is reward.compute_score else None


def _scoring_problems(file: str, scorer) -> list[str]:
    """What the reward manager would fail on in a parquet file: rows without a data_source, sources without a scorer,
    and (for rpg's compute_score) ground truths its scorers cannot read. Reads two columns only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rpg.data import reward

    name, has_scorer, owns_ground_truths = scorer
    try:
        parquet = pq.ParquetFile(file)
        schema = parquet.schema_arrow
        if "data_source" not in schema.names:
            return [f"{file}: no data_source column (it selects each row's scorer)"]
        sources = parquet.read(columns=["data_source"]).column(0).to_pylist()
        truths = None
        rm = schema.field("reward_model").type if "reward_model" in schema.names else None
        if rm is not None and pa.types.is_struct(rm) and rm.get_field_index("ground_truth") >= 0:
            rows = parquet.read(columns=["reward_model.ground_truth"]).column(0).to_pylist()
            truths = [(row or {}).get("ground_truth") for row in rows]
    except Exception as e:  # noqa: BLE001 -- unreadable file: report it with the reader's message
        return [f"{file}: cannot be read as parquet ({type(e).__name__}: {e})"]
    problems = []
    counts = collections.Counter(sources)
    if nulls := counts.pop(None, 0):
        problems.append(f"{file}: {nulls} rows have no data_source (null); every row needs one, it selects the scorer")
    for source, n in sorted(counts.items(), key=str):
        if not (isinstance(source, str) and has_scorer(source)):
            problems.append(
                f"{file}: data_source {source!r} ({n} rows) has no scorer in {name}; it scores "
                f"{', '.join(reward.own_sources()) + ' and ' if owns_ground_truths else ''}the sources of verl's "
                f"default_compute_score (verl/utils/reward_score/__init__.py). Fix: rename the source in the data, or "
                f"set reward.custom_reward_function to a function that scores it."
            )
    if not owns_ground_truths:
        return problems
    if truths is None:
        return problems + [f"{file}: no reward_model.ground_truth column (the reward manager reads it)"]
    bad = []
    for row, (source, truth) in enumerate(zip(sources, truths, strict=True)):
        if isinstance(source, str) and reward.scorer_for(source) is not None:
            try:
                reward.ground_truth_text(truth)
            except ValueError as e:
                bad.append((row, e))
    if bad:
        row, error = bad[0]
        problems.append(f"{file}: row {row} reward_model.ground_truth: {error} ({len(bad)} rows like this)")
    return problems


def _rule_data_sources_scored(config: DictConfig) -> Optional[str]:
    scorer = _configured_scorer(config)
    if scorer is None:
        return None
    problems = []
    for key in ("data.train_files", "data.val_files"):
        for path in _paths(config, key):
            for file in _local_files(path) or []:  # missing files: PATH_RULES
                if file.endswith(".parquet") and os.path.isfile(file):
                    problems += [f"{key}{_knob(key)}: {p}" for p in _scoring_problems(file, scorer)]
    return "\n- ".join(problems) or None


THINKING_KEY = "data.apply_chat_template_kwargs.enable_thinking"


def _rule_enable_thinking(config: DictConfig) -> Optional[str]:
    """`enable_thinking`, when given, is a boolean: Qwen3's chat template tests `enable_thinking is false`, so any
    other value (a string 'false', 0, null) would silently render the thinking template."""
    kwargs = config.data.get("apply_chat_template_kwargs", None) or {}
    if "enable_thinking" not in kwargs or isinstance(kwargs.enable_thinking, bool):
        return None
    return (
        f"{THINKING_KEY}={kwargs.enable_thinking!r}{_knob(THINKING_KEY)} is not valid; choose one of: true, false "
        f"(false renders Qwen3's template without its thinking block; docs/differences.md#d26)"
    )


def chat_template_summary(config: DictConfig) -> str:
    """One line saying which chat template renders the prompts (training and validation): thinking on/off and the
    kwargs verl passes to `apply_chat_template` (its dataset and agent loop read `data.apply_chat_template_kwargs`)."""
    kwargs = OmegaConf.to_container(config.data.get("apply_chat_template_kwargs", None) or OmegaConf.create())
    thinking = kwargs.get("enable_thinking")
    mode = (
        "the template's default (a Qwen3 template thinks)"
        if thinking is None
        else f"thinking {'on' if thinking else 'off'}"
    )
    return f"[rpg] chat template: {mode} (data.apply_chat_template_kwargs={kwargs})"


RECIPE_RULES: tuple[Callable[[DictConfig], Optional[str]], ...] = (
    _rule_enable_thinking,
    _rule_filter_groups_needs_v1,
    _rule_reward_manager,
    _rule_custom_reward_fn,
    _rule_overlong_buffer,
    _rule_resume_settings,
    _rule_run_names,
    _rule_context_fits_model,
    _rule_data_sources_scored,
)


def validate_recipe(config: DictConfig) -> None:
    """Recipe rules verl does not check up front (the chat template's `enable_thinking`, dynamic-sampling trainer,
    reward manager and score function, DAPO overlong buffer, resume settings, run names, context length vs the model,
    a scorer for every data source and ground truth of the local data files)."""
    errors = [msg for rule in RECIPE_RULES if (msg := rule(config))]
    if errors:
        raise RecipeConfigError("invalid recipe configuration:\n- " + "\n- ".join(errors))


# --------------------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------------------
def validate(config: DictConfig, *, real_launch: bool = False) -> ValidatedConfig:
    """All checks on a composed config: verl's, the dataclass builds, the recipe rules and the RPG rules.

    Local paths that do not exist (`check_paths`) are returned in `path_problems` (a dry run reports them), or raised
    with `real_launch=True`.
    """
    from rpg.schedule_free import check_config as check_schedule_free

    validated = build_verl_configs(config)
    validated.path_problems = check_paths(config)
    if real_launch and validated.path_problems:
        raise RecipeConfigError("missing input:\n- " + "\n- ".join(validated.path_problems))
    validate_recipe(config)
    validated.rpg = validate_rpg(config)
    check_schedule_free(config)  # optimizer and trainer agree (schedule-free needs its trainer mode, and only it)
    return validated


def compose_and_validate(overrides: Sequence[str]) -> ValidatedConfig:
    """Compose verl's config with `overrides` and run every check, in-process (no Ray). For tests and tools."""
    return validate(compose_config(overrides))


def dry_run_requested(environ=os.environ) -> bool:
    value = environ.get(DRY_RUN_ENV, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise RecipeConfigError(f"{DRY_RUN_ENV}={environ[DRY_RUN_ENV]!r} is not valid; use 1 (dry run) or 0")
    return value in _TRUE


def run(config: DictConfig) -> None:
    """Validate, then dry-run (print YAML) or train with verl's `run_ppo`, as `verl.trainer.main_ppo.main` does."""
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    dry_run = dry_run_requested()
    validated = validate(config, real_launch=not dry_run)
    print(chat_template_summary(config), file=sys.stderr)
    if dry_run:
        for problem in validated.path_problems:
            print(f"[rpg] dry run: a real launch would refuse: {problem}", file=sys.stderr)
        sys.stdout.write(OmegaConf.to_yaml(config, resolve=True))
        sys.stdout.flush()
        return
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    if config.trainer.use_v1:
        run_ppo(config, task_runner_class=TaskRunnerV1)
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner

        run_ppo(config, task_runner_class=TaskRunner)


def list_losses(args: Sequence[str]) -> None:
    """`python -m rpg.launch --list [--markdown]`: print the loss table (the README's table with `--markdown`)."""
    from rpg.losses import describe_losses

    extra = [a for a in args if a != "--markdown"]
    if extra:
        raise SystemExit(f"python -m rpg.launch --list takes only --markdown, got {extra}")
    sys.stdout.write(describe_losses(markdown="--markdown" in args))


def main(argv: Optional[Sequence[str]] = None) -> None:
    import hydra

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--list"]:
        return list_losses(args[1:])
    if dry_run_requested():  # no run directory, no log file: a dry run leaves nothing behind
        args += ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=disabled"]
    sys.argv = [sys.argv[0], *normalise_overrides(args)]
    entry = hydra.main(config_path=str(CONFIG_DIR), config_name=CONFIG_NAME, version_base=None)(run)
    entry()


if __name__ == "__main__":
    main()
