"""Recipe rules that are not RPG-specific: settings verl would reject late (inside a Ray worker) or silently ignore
(dynamic-sampling trainer, reward manager and score function, DAPO overlong buffer, resume settings, run names, the
chat template's `enable_thinking`, what separate_async asserts), plus the launch inputs of `rpg.preflight.inputs`
that are checked as rules."""

from __future__ import annotations

import re
from typing import Callable, Optional

from omegaconf import DictConfig, OmegaConf

from rpg import modes
from rpg.preflight.compose import RecipeConfigError
from rpg.preflight.inputs import RESUME_MODES, _knob, _rule_context_fits_model, _rule_data_sources_scored

OVERLONG_BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")


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


def _rule_fsdp2_for_tested_features(config: DictConfig) -> Optional[str]:
    """The periodic reference (its weight copy between the actor and reference engines) and schedule-free AdamW (its
    parameter swaps) are tested on FSDP2 only: refuse them with verl's FSDP1 (`strategy=fsdp`)."""
    arr = config.actor_rollout_ref
    features = []
    if modes.selected(arr.actor.policy_loss)[0].writes_reference:
        features.append(f"policy_loss.reference={arr.actor.policy_loss.reference}")
    optim = arr.actor.get("optim", None) or {}
    if "schedulefree" in str(optim.get("optimizer_impl", "")).lower() or modes.trainer_mode(config).schedule_free:
        features.append("schedule-free AdamW (OPTIM=schedulefree)")
    if not features:
        return None
    fsdp1 = [f"actor_rollout_ref.{role}.strategy=fsdp" for role in ("actor", "ref")
             if str(arr[role].get("strategy", "")) == "fsdp"]
    if not fsdp1:
        return None
    return (
        f"{' and '.join(features)} with {' and '.join(fsdp1)} (FSDP1): tested on FSDP2 only. Fix: remove the "
        f"strategy override (the recipes use FSDP2, rpg/config/rpg_trainer.yaml) or set "
        f"actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 (docs/differences.md#d27)"
    )


def _rule_separate_async(config: DictConfig) -> Optional[str]:
    """verl's separate_async asserts inside its trainer (a Ray actor) what is checked here before launch: a rollout
    pool of its own, a checkpoint engine other than `naive`, one weight sync per `parameter_sync_step` mini-batches;
    and on CPU no checkpoint engine runs at all (docs/async.md#knobs)."""
    mode = modes.trainer_mode(config)  # the trainer-mode table's row (rpg/modes.py)
    if not mode.detached_actor:
        return None
    if str(config.trainer.get("device", "cuda")) == "cpu":
        return (
            f"trainer.v1.trainer_mode={mode.name} (recipe knob TRAINER_MODE) with the CPU profile: no checkpoint "
            f"engine runs on CPU: verl registers only `naive`, which {mode.name} refuses; nccl/nixl/mooncake/kimi/"
            "delta_sharded need cupy or GPU libraries. The nearest working configuration is TRAINER_MODE="
            "colocate_async (docs/async.md#knobs)"
        )
    rollout, problems = config.actor_rollout_ref.rollout, []
    if int(rollout.nnodes) <= 0:
        problems.append(f"actor_rollout_ref.rollout.nnodes={rollout.nnodes} (the standalone rollout pool: nodes > 0)")
    if int(rollout.n_gpus_per_node) <= 0:
        problems.append(f"actor_rollout_ref.rollout.n_gpus_per_node={rollout.n_gpus_per_node} (set GPUs per node > 0)")
    backend = rollout.checkpoint_engine.backend
    if backend == "naive":
        problems.append(
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend!r} (the weight sync to the standalone "
            f"rollout needs nccl, nixl, mooncake, ...)"
        )
    batch, mini = int(config.data.train_batch_size), int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    sync_step = int(config.trainer.v1[mode.name].parameter_sync_step)
    if batch != sync_step * mini:
        problems.append(
            f"data.train_batch_size={batch} must equal trainer.v1.{mode.name}.parameter_sync_step={sync_step} × "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}"
        )
    if not problems:
        return None
    return f"trainer.v1.trainer_mode={mode.name} (recipe knob TRAINER_MODE) needs: " + "; ".join(problems)


def async_correction_warning(config: DictConfig) -> Optional[str]:
    """A warning line for an asynchronous trainer mode without TIS weights (decoupled mode, `rollout_is` unset): the
    stale samples are used as if π_old had drawn them (docs/async.md#no-correction); None otherwise."""
    mode = modes.trainer_mode(config)  # the trainer-mode table's row (rpg/modes.py)
    corr = config.algorithm.get("rollout_correction", None) or {}
    if not mode.asynchronous or corr.get("bypass_mode", False) or corr.get("rollout_is", None) is not None:
        return None
    return (
        f"[rpg] warning: trainer.v1.trainer_mode={mode.name} without algorithm.rollout_correction.rollout_is: stale "
        f"samples are used as if π_old had drawn them, the uncorrected, biased case (docs/async.md#no-correction); "
        f"algorithm.rollout_correction.rollout_is=token adds the TIS weights"
    )


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
    _rule_fsdp2_for_tested_features,
    _rule_separate_async,
    _rule_context_fits_model,
    _rule_data_sources_scored,
)


def validate_recipe(config: DictConfig) -> None:
    """Recipe rules verl does not check up front (the chat template's `enable_thinking`, dynamic-sampling trainer,
    reward manager and score function, DAPO overlong buffer, resume settings, run names, separate_async's settings,
    context length vs the model, a scorer for every data source and ground truth of the local data files)."""
    errors = [msg for rule in RECIPE_RULES if (msg := rule(config))]
    if errors:
        raise RecipeConfigError("invalid recipe configuration:\n- " + "\n- ".join(errors))
