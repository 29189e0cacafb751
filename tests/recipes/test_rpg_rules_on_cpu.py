"""Compose-time rules driven by the loss table (rpg/losses.py `LOSSES`): clip settings are validated for every loss
that reads them, and RPG options that cannot change the chosen loss or reference mode are refused. Configs are
verl's real `ppo_trainer`, composed once per module; one real dry run covers the `bash recipe → python -m rpg.launch`
path."""

from __future__ import annotations

import sys

import pytest
from recipe_helpers import RECIPE, as_launched, cfg_with, overrides, refused

from rpg.launch import RecipeConfigError, compose_config, validate_rpg

MINIMAL = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "algorithm.adv_estimator=rpg",
    "actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_urkl",
    "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
]
ACTOR = "actor_rollout_ref.actor."
PL = ACTOR + "policy_loss."


@pytest.fixture(scope="module")
def base():
    return compose_config(MINIMAL)


# ---- clip settings ---------------------------------------------------------------------------------------------------
BAD_CLIPS = [
    ("clip_ratio_c", 1.0),
    ("clip_ratio_c", 0.5),
    ("clip_ratio_low", 1.0),
    ("clip_ratio_low", 1.5),
    ("clip_ratio_low", 0.0),
    ("clip_ratio_high", 0.0),
]


@pytest.mark.parametrize("loss", ["rpg_fkl", "rpg_reinforce_urkl", "grpo_wk3", "vanilla"])
@pytest.mark.parametrize("field, value", BAD_CLIPS)
def test_bad_clip_settings_are_refused_at_compose_time(base, loss, field, value):
    updates = {PL + "loss_mode": loss, ACTOR + field: value}
    if loss == "vanilla":
        updates[PL + "_target_"] = "verl.workers.config.PolicyLossConfig"
        updates["algorithm.adv_estimator"] = "grpo"
    if loss == "grpo_wk3":
        updates.update({ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0})
    message = refused(cfg_with(base, updates))
    assert f"actor_rollout_ref.actor.{field}={value}" in message and loss in message


@pytest.mark.parametrize("field, value", [f for f in BAD_CLIPS if f[0] != "clip_ratio_c"])
def test_hardclip_checks_its_ratio_clip(base, field, value):
    message = refused(cfg_with(base, {PL + "loss_mode": "rpg_reinforce_hardclip_rkl", ACTOR + field: value}))
    assert f"actor_rollout_ref.actor.{field}={value}" in message


def test_hardclip_does_not_read_c(base):
    """The hard-clip loss has no dual clip: c is never read, so verl's own default (or any value) is fine."""
    cfg = cfg_with(base, {PL + "loss_mode": "rpg_reinforce_hardclip_rkl", ACTOR + "clip_ratio_c": 1.0})
    assert as_launched(validate_rpg, cfg).loss_mode == "rpg_reinforce_hardclip_rkl"


def test_clip_ratio_is_the_fallback_of_low_and_high(base):
    cfg = cfg_with(base, {ACTOR + "clip_ratio_low": None, ACTOR + "clip_ratio_high": None, ACTOR + "clip_ratio": 1.2})
    assert "actor_rollout_ref.actor.clip_ratio_low=1.2" in refused(cfg)


def test_good_clip_settings_pass(base):
    cfg = cfg_with(base, {ACTOR + "clip_ratio_low": 0.1, ACTOR + "clip_ratio_high": 5.0})
    assert as_launched(validate_rpg, cfg) is not None


def test_dry_run_refuses_a_bad_c(monkeypatch, capsys, tmp_path):
    """`RPG_DRY_RUN=1 bash <cpu script> actor_rollout_ref.actor.clip_ratio_c=1.0`, in-process through `rpg.launch.main`
    (Hydra's entry, as the shell runs it; the shell -> python refusal path itself runs for real in
    test_gpu_launch_on_cpu.py::test_real_dry_run_prints_the_plan_once_and_refuses_over_budget)."""
    from rpg import launch

    monkeypatch.setattr(sys, "argv", ["rpg.launch"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RPG_DRY_RUN", "1")
    for name in ("RAY_ADDRESS", "SMOKE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as info:
        launch.main([*overrides(RECIPE / "cpu" / "run_rpg_reinforce_urkl.sh"), "actor_rollout_ref.actor.clip_ratio_c=1.0"])
    out, err = capsys.readouterr()
    assert info.value.code not in (0, None) and out == ""
    assert "actor_rollout_ref.actor.clip_ratio_c=1.0" in f"{err}{info.value.code}"


# ---- options without effect ------------------------------------------------------------------------------------------
INEFFECTIVE = [
    ("rpg_reinforce_urkl", {"kl_clamp": 10.0}, "kl_clamp"),
    ("rpg_reinforce_urkl", {"kl_placement": "inside_clip"}, "kl_placement"),
    ("rpg_reinforce_hardclip_ufkl", {"kl_clamp": 10.0}, "kl_clamp"),
    ("rpg_reinforce_hardclip_ufkl", {"branch_on": "advantage"}, "branch_on"),
    ("rpg_urkl", {"branch_on": "advantage"}, "branch_on"),
    ("rpg_urkl", {"kl_ratio": "raw"}, "kl_ratio"),
    ("grpo_wk3", {"kl_ratio": "raw"}, "kl_ratio"),
    ("rpg_fkl", {"kl_clamp": 10.0}, "kl_clamp"),  # the authors clamp every divergence but FKL
    ("rpg_reinforce_fkl", {"kl_ratio": "raw"}, "kl_ratio"),  # FKL's C_KL is the constant β: no ratio to clip
    ("rpg_urkl", {"ref_refresh_steps": 8}, "ref_refresh_steps"),
    ("rpg_reinforce_rkl", {"reference": "frozen", "ref_refresh_kl": 0.1}, "ref_refresh_kl"),
    ("rpg_reinforce_rkl", {"ref_kl_ema": 0.5}, "ref_kl_ema"),
]


@pytest.mark.parametrize("loss, options, name", INEFFECTIVE)
def test_options_without_effect_are_refused(base, loss, options, name):
    updates = {PL + "loss_mode": loss} | {PL + k: v for k, v in options.items()}
    if loss == "grpo_wk3" or options.get("reference") == "frozen":
        updates.update({ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0})
    with pytest.raises(RecipeConfigError) as info:
        as_launched(validate_rpg, cfg_with(base, updates))
    message = f"{info.value} {info.value.__cause__!r}"
    assert f"{name}=" in message and "no effect" in message and loss in message


EFFECTIVE = [
    ("rpg_reinforce_urkl", {"branch_on": "advantage", "kl_ratio": "raw"}),
    ("rpg_reinforce_hardclip_ufkl", {"kl_ratio": "raw"}),
    ("rpg_urkl", {"kl_clamp": 10.0, "kl_placement": "inside_clip"}),
    ("grpo_wk3", {"kl_clamp": 10.0, "kl_placement": "inside_clip"}),
    ("rpg_reinforce_rkl", {"reference": "periodic", "ref_refresh_steps": 8, "ref_refresh_kl": 0.1, "ref_kl_ema": 0.5}),
]


@pytest.mark.parametrize("loss, options", EFFECTIVE)
def test_options_with_effect_and_defaults_pass(base, loss, options):
    updates = {PL + "loss_mode": loss} | {PL + k: v for k, v in options.items()}
    if loss == "grpo_wk3" or "reference" in options:
        updates.update({ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0})
    assert as_launched(validate_rpg, cfg_with(base, updates)).loss_mode == loss
    # every option at its default is fine for every loss (the recipes pass some of them explicitly)
    defaults = {PL + k: v for k, v in dict(kl_clamp=None, branch_on="effective_advantage", kl_ratio="clipped",
                                              kl_placement="additive", ref_refresh_steps=0, ref_refresh_kl=0.0,
                                              ref_kl_ema=0.9).items()}
    updates = {PL + "loss_mode": loss} | defaults
    if loss == "grpo_wk3":
        updates.update({ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0})
    assert as_launched(validate_rpg, cfg_with(base, updates)).loss_mode == loss


def test_verl_losses_with_the_rpg_config_accept_only_the_periodic_reference():
    """With a verl loss (e.g. GRPO's vanilla) the RPG config can only refresh verl's reference model periodically."""
    from rpg.loss_config import RPGPolicyLossConfig

    assert RPGPolicyLossConfig(loss_mode="vanilla", reference="periodic", ref_refresh_steps=4).spec is None
    for options, name in [({"kl_coef": 1e-3}, "kl_coef"), ({"reference": "frozen"}, "reference"),
                          ({"branch_on": "advantage"}, "branch_on")]:
        with pytest.raises(ValueError, match=f"{name}=.* has no effect on verl's loss_mode='vanilla'"):
            RPGPolicyLossConfig(loss_mode="vanilla", **options)
