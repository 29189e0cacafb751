"""The launcher's rules for the EMA reference and the adaptive β (rpg/preflight/rpg_rules.py, recipe_rules.py), on
copies of the minimal composed config of test_launch_on_cpu.py: refused before Ray starts, naming the setting, the
reason and the fix."""

from __future__ import annotations

import pytest
from recipe_helpers import as_launched, cfg_with
from test_launch_on_cpu import MINIMAL

from rpg.launch import RecipeConfigError, compose_config, validate_recipe, validate_rpg

ACTOR = "actor_rollout_ref__actor__"
PL = ACTOR + "policy_loss__"
REF_MODEL = {ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0}
EMA = {PL + "reference": "ema", PL + "ref_ema_decay": 0.99, PL + "ref_ema_period": 16, **REF_MODEL}
BETA = {PL + "kl_control": "adaptive", PL + "kl_target": 0.01, PL + "kl_horizon": 10.0}


@pytest.fixture(scope="module")
def base():
    return compose_config(MINIMAL)


def test_ema_and_adaptive_beta_are_accepted(base):
    settings = as_launched(validate_rpg, cfg_with(base, **EMA, **BETA))
    assert (settings.reference, settings.ref_ema_decay, settings.ref_ema_period) == ("ema", 0.99, 16)
    assert (settings.kl_control, settings.kl_target, settings.kl_horizon) == ("adaptive", 0.01, 10.0)
    assert as_launched(validate_rpg, cfg_with(base, **BETA)).reference == "iterative"  # the drift within a step


@pytest.mark.parametrize("updates, match", [
    ({PL + "ref_ema_decay": 1.0}, r"ref_ema_decay .*must be in \[0, 1\), got 1.0"),
    ({PL + "ref_ema_period": 0}, r"ref_ema_period .*integer ≥ 1, got 0"),
    ({**BETA, PL + "kl_target": -0.1}, r"kl_target .*> 0 with kl_control='adaptive', got -0.1"),
    ({**BETA, PL + "kl_horizon": 0.0}, r"kl_horizon .*> 0.2, got 0.0"),
])  # fmt: skip
def test_bad_values_are_named_with_their_range(base, updates, match):
    with pytest.raises(RecipeConfigError, match=match):
        as_launched(validate_rpg, cfg_with(base, **{**EMA, **updates}))


def test_ema_needs_the_reference_model(base):
    with pytest.raises(RecipeConfigError, match=r"policy_loss.reference='ema' needs verl's reference model"):
        as_launched(validate_rpg, cfg_with(base, **{PL + "reference": "ema"}))


@pytest.mark.parametrize("updates, needle", [
    ({"actor_rollout_ref__ref__fsdp_config__model_dtype": "bf16"},
     "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16 (the EMA blend"),
    ({"actor_rollout_ref__model__lora_rank": 8},
     "LoRA (actor_rollout_ref.model.lora_rank=8): an EMA reference under LoRA is not an adapter"),
    ({ACTOR + "strategy": "megatron"}, "actor_rollout_ref.actor.strategy=megatron"),
])  # fmt: skip
def test_ema_is_refused_where_it_cannot_run(base, updates, needle):
    with pytest.raises(RecipeConfigError, match="policy_loss.reference=ema cannot run with") as e:
        as_launched(validate_rpg, cfg_with(base, **EMA, **updates))
    assert needle in str(e.value)


def test_hooked_features_are_refused_in_separate_async(base):
    separate = {"trainer__v1__trainer_mode": "separate_async"}
    with pytest.raises(RecipeConfigError, match=r"policy_loss.kl_control=adaptive with trainer.v1.trainer_mode="
                                                r"separate_async"):  # fmt: skip
        as_launched(validate_rpg, cfg_with(base, **BETA, **separate))
    with pytest.raises(RecipeConfigError, match=r"policy_loss.reference=ema with trainer.v1.trainer_mode="):
        as_launched(validate_rpg, cfg_with(base, **EMA, **separate))


def test_verls_adaptive_kl_ctrl_is_refused_with_the_pointer(base):
    with pytest.raises(RecipeConfigError, match=r"algorithm.kl_ctrl.type=adaptive next to an RPG loss") as e:
        as_launched(validate_rpg, cfg_with(base, algorithm__kl_ctrl__type="adaptive"))
    assert "+actor_rollout_ref.actor.policy_loss.kl_control=adaptive" in str(e.value)
    assert "docs/losses.md#adaptive-beta" in str(e.value)


def test_ema_on_several_nodes_gets_the_shared_checkpoint_check(base):
    """The EMA reference's weights are written by each rank and its state by rank 0 next to verl's checkpoint: on
    several nodes the launcher checks that every node sees CKPTS_DIR (rpg.preflight.shared_ckpt) before training, as
    for every run that saves; the rules no longer ask for a declaration."""
    from rpg.preflight import shared_ckpt

    cfg = cfg_with(base, **EMA, trainer__nnodes=2, trainer__save_freq=20)
    as_launched(validate_rpg, cfg)
    assert shared_ckpt.needs_check(cfg)
    assert not shared_ckpt.needs_check(cfg_with(base, **EMA, trainer__save_freq=20))  # one node


def test_fsdp1_is_refused_for_ema(base):
    with pytest.raises(RecipeConfigError, match=r"policy_loss.reference=ema with actor_rollout_ref.actor.strategy="
                                                r"fsdp and actor_rollout_ref.ref.strategy=fsdp \(FSDP1\)"):  # fmt: skip
        validate_recipe(cfg_with(base, **EMA, **{ACTOR + "strategy": "fsdp",
                                                 "actor_rollout_ref__ref__strategy": "fsdp"}))  # fmt: skip
