"""Unit tests of `rpg.launch`: the RPG rules (`validate_rpg`), the recipe rules (`validate_recipe`), the verl
dataclass builds, override normalisation and the dry-run switch. Configs are verl's real `ppo_trainer`, composed once
and copied per test."""

from __future__ import annotations


import pytest
from hydra.errors import ConfigCompositionException, InstantiationException
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError
from recipe_helpers import as_launched, cfg_with

from rpg.loss_config import BYPASS_ERROR, RPGPolicyLossConfig
from rpg.launch import (
    RecipeConfigError,
    build_verl_configs,
    compose_config,
    dry_run_requested,
    normalise_overrides,
    validate_recipe,
    validate_rpg,
)

MINIMAL = [  # the smallest config verl's validate_config accepts without a GPU-specific setting
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "algorithm.adv_estimator=rpg",
    "actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_urkl",
    "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig",
    "+actor_rollout_ref.actor.policy_loss.kl_coef=1e-4",
    "+actor_rollout_ref.actor.policy_loss.reference=iterative",
    "reward.reward_manager.name=dapo",
    "data.max_response_length=512",
    "+reward.reward_kwargs.max_resp_len=512",
    "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward.reward_kwargs.overlong_buffer_cfg.len=128",
    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
]


@pytest.fixture(scope="module")
def base():
    return compose_config(MINIMAL)


ACTOR = "actor_rollout_ref__actor__"
PL = ACTOR + "policy_loss__"


def test_rpg_config_is_returned(base):
    settings = as_launched(validate_rpg, base)
    assert isinstance(settings, RPGPolicyLossConfig)
    assert (settings.loss_mode, settings.kl_coef, settings.reference) == ("rpg_reinforce_urkl", 1e-4, "iterative")


def test_both_target_spellings_are_accepted(base):
    cfg = cfg_with(base, **{PL + "_target_": "rpg.loss_config.RPGPolicyLossConfig"})
    assert isinstance(as_launched(validate_rpg, cfg), RPGPolicyLossConfig)


@pytest.mark.parametrize("loss, adv", [("vanilla", "grpo"), ("vanilla", "reinforce_plus_plus"), ("gspo", "grpo")])
def test_non_rpg_losses_need_no_rpg_config(base, loss, adv):
    cfg = cfg_with(base, **{PL + "_target_": "verl.workers.config.PolicyLossConfig", PL + "loss_mode": loss})
    cfg.algorithm.adv_estimator = adv
    with open_dict(cfg):  # a plain PolicyLossConfig has no RPG fields
        del cfg.actor_rollout_ref.actor.policy_loss["kl_coef"], cfg.actor_rollout_ref.actor.policy_loss["reference"]
    assert as_launched(validate_rpg, cfg) is None


def test_unregistered_loss_lists_valid_names(base):
    cfg = cfg_with(base, **{PL + "loss_mode": "rpg_reinforce_kl"})
    with pytest.raises(RecipeConfigError, match="not a registered policy loss") as info:
        as_launched(validate_rpg, cfg)
    for name in ("rpg_reinforce_urkl", "rpg_ufkl", "rpg_reinforce_hardclip_rkl", "grpo_wk3", "vanilla"):
        assert name in str(info.value)


def test_unregistered_estimator_lists_valid_names(base):
    cfg = cfg_with(base, algorithm__adv_estimator="rpg_group")
    with pytest.raises(RecipeConfigError, match="algorithm.adv_estimator='rpg_group'") as info:
        as_launched(validate_rpg, cfg)
    assert "rpg_batchmean" in str(info.value) and "grpo" in str(info.value)


def test_rpg_loss_needs_rpg_policy_loss_target(base):
    """An RPG loss_mode with verl's own target (the override forgotten) and no RPG field set: verl builds its
    PolicyLossConfig, and the rule names the missing override. (With an RPG field set, verl's build refuses first.)"""
    cfg = cfg_with(base, **{PL + "_target_": "verl.workers.config.PolicyLossConfig"})
    with open_dict(cfg):  # the fields verl's PolicyLossConfig does not have
        del cfg.actor_rollout_ref.actor.policy_loss["kl_coef"], cfg.actor_rollout_ref.actor.policy_loss["reference"]
    with pytest.raises(RecipeConfigError, match=r"policy_loss._target_=rpg.RPGPolicyLossConfig"):
        as_launched(validate_rpg, cfg)


@pytest.mark.parametrize(
    "key, value, needle",
    [("branch_on", "sign", "branch_on"), ("kl_coef", -1.0, "kl_coef"), ("reference", "frozn", "reference")],
)
def test_invalid_rpg_values_fail(base, key, value, needle):
    cfg = cfg_with(base, **{PL + key: value})
    with pytest.raises(RecipeConfigError) as info:
        as_launched(validate_rpg, cfg)
    assert needle in f"{info.value} {info.value.__cause__!r}"


def test_bypass_mode_is_refused_in_the_legacy_trainer(base):
    cfg = cfg_with(base, algorithm__rollout_correction__bypass_mode=True, trainer__use_v1=False)
    with pytest.raises(RecipeConfigError) as info:
        as_launched(validate_rpg, cfg)
    assert BYPASS_ERROR in str(info.value)
    assert "trainer.use_v1=False" in str(info.value)


def test_bypass_mode_is_accepted_in_the_v1_trainer(base):
    """The v1 trainer copies the rollout's log-probs into old_log_probs and leaves loss_mode alone
    (docs/async.md#bypass): the RPG loss runs with π_old := μ."""
    cfg = cfg_with(base, algorithm__rollout_correction__bypass_mode=True, trainer__use_v1=True)
    assert isinstance(as_launched(validate_rpg, cfg), RPGPolicyLossConfig)


@pytest.mark.parametrize("key, value", [("rollout_is", "token"), ("rollout_rs", "token_k1")])
def test_bypass_mode_with_rollout_correction_is_refused(base, key, value):
    """verl's v1 trainer skips the rollout correction in bypass: the weights / rejection would be silently ignored."""
    cfg = cfg_with(base, algorithm__rollout_correction__bypass_mode=True,
                   **{f"algorithm__rollout_correction__{key}": value})
    with pytest.raises(RecipeConfigError, match=f"rollout_correction.{key}={value!r}.*silently ignored"):
        as_launched(validate_rpg, cfg)


def test_kl_in_reward_is_refused(base):
    cfg = cfg_with(base, algorithm__use_kl_in_reward=True)
    with pytest.raises(RecipeConfigError, match="use_kl_in_reward=True cannot be combined with an RPG loss"):
        as_launched(validate_rpg, cfg)


def test_iterative_reference_refuses_a_second_kl(base):
    cfg = cfg_with(base, **{ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 1e-3})
    with pytest.raises(RecipeConfigError, match="on top of the RPG KL"):
        as_launched(validate_rpg, cfg)
    # a reference model that adds nothing is allowed (wasteful, not wrong)
    no_second_kl = cfg_with(base, **{ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0})
    assert as_launched(validate_rpg, no_second_kl) is not None


@pytest.mark.parametrize(
    "updates",
    [
        {PL + "reference": "frozen"},
        {PL + "reference": "periodic", PL + "ref_refresh_steps": 16},
        {PL + "loss_mode": "grpo_wk3"},
    ],
    ids=["frozen", "periodic", "grpo_wk3"],
)
def test_reference_model_modes_need_use_kl_loss_with_zero_coef(base, updates):
    with pytest.raises(RecipeConfigError, match="needs verl's reference model"):
        as_launched(validate_rpg, cfg_with(base, **updates))  # use_kl_loss=False
    with_kl_loss = cfg_with(base, **updates, **{ACTOR + "use_kl_loss": True})
    with pytest.raises(RecipeConfigError, match="needs verl's reference model"):
        as_launched(validate_rpg, cfg_with(with_kl_loss, **{ACTOR + "kl_loss_coef": 1e-3}))
    ok = as_launched(validate_rpg, cfg_with(with_kl_loss, **{ACTOR + "kl_loss_coef": 0.0}))
    assert isinstance(ok, RPGPolicyLossConfig)


def test_all_violations_are_reported_together(base):
    cfg = cfg_with(
        base,
        algorithm__use_kl_in_reward=True,
        algorithm__rollout_correction__bypass_mode=True,
        trainer__use_v1=False,
        **{ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 1e-3},
    )
    with pytest.raises(RecipeConfigError) as info:
        as_launched(validate_rpg, cfg)
    assert str(info.value).count("\n- ") == 3


# --------------------------------------------------------------------------------------------------------------
def test_recipe_rules_accept_the_base(base):
    validate_recipe(base)


@pytest.mark.parametrize(
    "updates, needle",
    [
        ({"algorithm__filter_groups__enable": True, "trainer__use_v1": False}, "needs the v1 trainer"),
        ({"reward__reward_kwargs__max_resp_len": 1024}, "must equal data.max_response_length=512"),
        ({"reward__reward_kwargs__overlong_buffer_cfg__len": 600}, "must be an integer in (0, max_resp_len=512]"),
        ({"reward__reward_kwargs__overlong_buffer_cfg__lenght": 3}, "unknown keys ['lenght']"),
        ({"reward__reward_manager__name": "naive"}, "only read by the 'dapo' reward manager"),
        ({"reward__reward_manager__name": "dapoo"}, "not a registered reward manager"),
        ({"reward__reward_manager__source": "pip"}, "choose 'register' or 'importlib'"),
        (
            {"reward__custom_reward_function__path": "pkg://rpg.data.reward",
             "reward__custom_reward_function__name": "nope"},  # fmt: skip
            "cannot be loaded",
        ),
    ],
)
def test_recipe_rules(base, updates, needle):
    with pytest.raises(RecipeConfigError) as info:
        validate_recipe(cfg_with(base, **updates))
    assert needle in str(info.value)


def test_overlong_buffer_off_needs_no_length(base):
    validate_recipe(cfg_with(base, reward__reward_kwargs__overlong_buffer_cfg__enable=False,
                             reward__reward_kwargs__max_resp_len=1))  # fmt: skip


def test_custom_reward_function_of_the_recipe_loads(base):
    validate_recipe(
        cfg_with(base, reward__custom_reward_function__path="pkg://rpg.data.reward",
                 reward__custom_reward_function__name="compute_score")  # fmt: skip
    )


# --------------------------------------------------------------------------------------------------------------
def test_verl_dataclasses_are_built(base):
    v = build_verl_configs(base)
    assert v.actor.policy_loss.kl_coef == 1e-4 and isinstance(v.actor.policy_loss, RPGPolicyLossConfig)
    assert v.ref is None and v.model is None  # no reference without a KL loss; hub model ids are not downloaded
    assert v.rollout.name == "vllm" and v.algorithm.adv_estimator == "rpg"


def test_reference_is_built_like_the_worker_builds_it(base):
    v = build_verl_configs(cfg_with(base, **{ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0}))
    assert v.ref is not None and v.ref.use_dynamic_bsz is True
    assert v.ref.ppo_mini_batch_size == base.actor_rollout_ref.actor.ppo_mini_batch_size


@pytest.mark.parametrize(
    "updates, error, needle",
    [  # OmegaConf's schema merge of the model, Hydra's instantiate of verl's dataclasses (wrapping their errors)
        ({"actor_rollout_ref__model__not_a_field": 1}, ConfigKeyError, "not_a_field"),
        ({"actor_rollout_ref__rollout__not_a_field": 1}, InstantiationException, "not_a_field"),
        ({"algorithm__not_a_field": 1}, InstantiationException, "not_a_field"),
        # bad value types: hydra's instantiate does not check them, rpg.launch does
        ({ACTOR + "clip_ratio_c": "ten"}, RecipeConfigError, "actor_rollout_ref.actor.clip_ratio_c='ten' has type str"),
        ({"actor_rollout_ref__rollout__temperature": "hot"}, RecipeConfigError, "rollout.temperature='hot'"),
        ({PL + "kl_coef": "1e-4x"}, RecipeConfigError, "kl_coef"),  # the RPG options' own check
        ({ACTOR + "use_dynamic_bsz": False}, InstantiationException, "ppo_micro_batch_size"),  # verl's own check
    ],
)
def test_verl_dataclass_errors_surface(base, updates, error, needle):
    with pytest.raises(error) as info:
        build_verl_configs(cfg_with(base, **updates))
    assert needle in f"{info.value} {info.value.__cause__!r}"


# --------------------------------------------------------------------------------------------------------------
def test_plus_overrides_become_add_or_override():
    assert normalise_overrides(["+a.b=1", "++c=2", "d=3", "~e"]) == ["++a.b=1", "++c=2", "d=3", "~e"]


def test_rpg_settings_work_with_or_without_plus():
    """Recipes pass kl_coef/reference only when set, so a plain override must add the key (verl's keys stay strict)."""
    pl = "actor_rollout_ref.actor.policy_loss."
    given = [pl + "reference=frozen", pl + "kl_coef=1e-3", pl + "loss_mode=rpg_urkl", pl + "kl_coeff=1", "a.kl_coef=1"]
    assert normalise_overrides(given) == ["++" + given[0], "++" + given[1], *given[2:]]
    cfg = compose_config([*MINIMAL, pl + "reference=frozen", "actor_rollout_ref.actor.use_kl_loss=True"])
    assert cfg.actor_rollout_ref.actor.policy_loss.reference == "frozen"
    cfg = compose_config([o for o in MINIMAL if ".reference=" not in o] + [pl + "reference=periodic"])
    assert cfg.actor_rollout_ref.actor.policy_loss.reference == "periodic"
    with pytest.raises(ConfigCompositionException, match="kl_coeff"):
        compose_config([*MINIMAL, pl + "kl_coeff=1"])


@pytest.mark.parametrize("value, expected", [("", False), ("0", False), ("false", False), ("1", True), ("TRUE", True)])
def test_dry_run_switch(value, expected):
    assert dry_run_requested({"RPG_DRY_RUN": value}) is expected
    assert dry_run_requested({}) is False


def test_dry_run_switch_rejects_garbage():
    with pytest.raises(RecipeConfigError, match="RPG_DRY_RUN='maybe' is not valid"):
        dry_run_requested({"RPG_DRY_RUN": "maybe"})


# --------------------------------------------------------------------------------------------------------------
def _keys(node, prefix=""):
    return {k for key, value in node.items() for k in ([f"{prefix}{key}"] + (
        sorted(_keys(value, f"{prefix}{key}.")) if isinstance(value, dict) else []))}  # fmt: skip


def test_rpg_trainer_extends_verls_ppo_trainer():
    """rpg/config/rpg_trainer.yaml = verl's own ppo_trainer (every key) + the recipes' shared settings; the values
    derived from the context follow it (rpg.preflight.compose's resolvers), and the `recipe` node is gone."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        verl_cfg = OmegaConf.to_container(compose(config_name="ppo_trainer"))
    cfg = compose_config([])
    assert _keys(verl_cfg) <= _keys(OmegaConf.to_container(cfg))
    assert (cfg.actor_rollout_ref.rollout.n, verl_cfg["actor_rollout_ref"]["rollout"]["n"]) == (16, 1)
    assert cfg.reward.reward_manager.name == "dapo" and cfg.actor_rollout_ref.actor.clip_ratio_c == 10.0
    buffer = cfg.reward.reward_kwargs.overlong_buffer_cfg
    assert (buffer.enable, buffer.len, cfg.data.max_response_length) == (True, 512, 2048) and "recipe" not in cfg
    overridden = compose_config(["data.max_response_length=1024", "recipe.token_len_factor=3"])
    assert overridden.reward.reward_kwargs.max_resp_len == 1024  # one source: data.max_response_length
    assert overridden.reward.reward_kwargs.overlong_buffer_cfg.len == 256  # the last quarter of it
    budget = 3 * (2048 + 1024)  # factor × (prompt + response)
    arr = overridden.actor_rollout_ref
    assert (arr.actor.ppo_max_token_len_per_gpu, arr.rollout.log_prob_max_token_len_per_gpu,
            arr.ref.log_prob_max_token_len_per_gpu, arr.rollout.max_num_batched_tokens) == (budget, budget, budget,
                                                                                           3072)  # fmt: skip
    assert not OmegaConf.is_interpolation(arr.actor, "ppo_max_token_len_per_gpu")  # resolved in the launcher


# --------------------------------------------------------------------------------------------------------------
# Trainer modes (docs/async.md#knobs): what the launcher refuses before Ray starts
# --------------------------------------------------------------------------------------------------------------
SEPARATE = {"trainer__v1__trainer_mode": "separate_async"}
SEPARATE_READY = {**SEPARATE, "actor_rollout_ref__rollout__nnodes": 1,
                  "actor_rollout_ref__rollout__checkpoint_engine__backend": "nccl", "data__train_batch_size": 128,
                  "trainer__v1__separate_async__parameter_sync_step": 4, ACTOR + "ppo_mini_batch_size": 32}
PERIODIC = {PL + "reference": "periodic", PL + "ref_refresh_steps": 16, ACTOR + "use_kl_loss": True,
            ACTOR + "kl_loss_coef": 0.0}


def test_separate_async_on_cpu_is_refused(base):
    with pytest.raises(RecipeConfigError, match=r"no checkpoint engine runs on CPU: verl registers only `naive`"):
        validate_recipe(cfg_with(base, trainer__device="cpu", **SEPARATE_READY))


def test_separate_async_needs_the_rollout_pool_and_a_checkpoint_engine(base):
    cfg = cfg_with(base, **SEPARATE, data__train_batch_size=512, **{ACTOR + "ppo_mini_batch_size": 32})
    with pytest.raises(RecipeConfigError) as info:
        validate_recipe(cfg)
    text = str(info.value)
    for needle in ("actor_rollout_ref.rollout.nnodes=0", "actor_rollout_ref.rollout.checkpoint_engine.backend='naive'",
                   "data.train_batch_size=512", "parameter_sync_step=4", "ppo_mini_batch_size=32"):
        assert needle in text, text
    validate_recipe(cfg_with(base, **SEPARATE_READY))  # all three set: accepted


def test_periodic_reference_with_separate_async_is_refused(base):
    with pytest.raises(RecipeConfigError, match=r"reference=periodic with trainer.v1.trainer_mode=separate_async"):
        as_launched(validate_rpg, cfg_with(base, **PERIODIC, **SEPARATE_READY))
    colocate_async = cfg_with(base, **PERIODIC, trainer__v1__trainer_mode="colocate_async")
    ok = as_launched(validate_rpg, colocate_async)  # measured working
    assert ok.reference == "periodic"


def test_async_without_rollout_is_is_flagged_as_uncorrected(base):
    from rpg.preflight.recipe_rules import async_correction_warning

    assert async_correction_warning(base) is None  # sync
    warning = async_correction_warning(cfg_with(base, trainer__v1__trainer_mode="colocate_async"))
    assert "uncorrected" in warning and "docs/async.md#no-correction" in warning
    corrected = cfg_with(base, trainer__v1__trainer_mode="colocate_async",
                         algorithm__rollout_correction__rollout_is="token")
    assert async_correction_warning(corrected) is None
    bypass = cfg_with(base, trainer__v1__trainer_mode="colocate_async", algorithm__rollout_correction__bypass_mode=True)
    assert async_correction_warning(bypass) is None  # π_old := μ: exact for its own anchor (docs/async.md#bypass)


def test_the_launcher_resolves_every_oc_env_before_ray(monkeypatch):
    """`finish` (run by compose_config and by rpg.launch before any Ray process starts) replaces an `oc.env`
    interpolation by the value of this shell: workers, other nodes and Ray jobs see that value, not their own."""
    monkeypatch.setenv("RPG_TEST_PROJECT", "from-the-shell")
    cfg = compose_config(["trainer.project_name=${oc.env:RPG_TEST_PROJECT,unset}",
                          "data.val_files=['/d/\\${oc.env:HOME}/v.parquet']"])  # fmt: skip
    monkeypatch.setenv("RPG_TEST_PROJECT", "a-worker's-value")
    assert not OmegaConf.is_interpolation(cfg.trainer, "project_name")
    assert cfg.trainer.project_name == "from-the-shell"
    assert cfg.trainer.default_local_dir.endswith("/ckpts/from-the-shell/" + cfg.trainer.experiment_name)
    assert list(cfg.data.val_files) == ["/d/${oc.env:HOME}/v.parquet"]  # an escaped `${` stays literal text
