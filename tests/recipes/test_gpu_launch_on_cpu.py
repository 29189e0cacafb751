"""The GPU side of the launcher, checked without a GPU: FSDP2 for every recipe (and FSDP1 refused where untested).

The recipe scripts are composed and validated once per session (`recipe_helpers.validated`, shared with
test_dry_run_on_cpu.py); rules are checked on copies of one composed config.
"""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf, open_dict
from recipe_helpers import RECIPE, SCRIPTS_4B, SCRIPTS_7B, validated

from rpg.launch import RecipeConfigError, validate_recipe

GPU_SCRIPTS = SCRIPTS_7B + SCRIPTS_4B


def with_(cfg, **updates):
    """A copy of `cfg` with dotted keys (`__` for `.`) set; new keys allowed."""
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        for key, value in updates.items():
            OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    return cfg


@pytest.fixture(scope="module")
def rpg_4b():
    return validated(RECIPE / "4b" / "run_rpg_urkl_2k.sh").config


# ---- 1. FSDP2 everywhere ---------------------------------------------------------------------------------------------
def test_the_gpu_scripts_are_found():
    assert (len(SCRIPTS_7B), len(SCRIPTS_4B)) == (60, 29)  # the authors' 60 and the paper's 4B rows


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_gpu_recipe_runs_actor_and_reference_on_fsdp2(script):
    arr = validated(script).config.actor_rollout_ref
    assert (arr.actor.strategy, arr.ref.strategy) == ("fsdp2", "fsdp2")


ARR = "actor_rollout_ref__"
PERIODIC = {ARR + "actor__policy_loss__reference": "periodic", ARR + "actor__use_kl_loss": True,
            ARR + "actor__kl_loss_coef": 0.0}  # fmt: skip
SCHEDULE_FREE = {ARR + "actor__optim__optimizer_impl": "schedulefree",
                 ARR + "actor__optim__optimizer": "AdamWScheduleFree", "trainer__v1__trainer_mode": "schedule_free_sync"}


@pytest.mark.parametrize("feature, needle", [(PERIODIC, "policy_loss.reference=periodic"),
                                             (SCHEDULE_FREE, "schedule-free AdamW")])  # fmt: skip
def test_fsdp1_is_refused_for_the_periodic_reference_and_schedule_free(rpg_4b, feature, needle):
    validate_recipe(with_(rpg_4b, **feature))  # on FSDP2: accepted
    fsdp1 = with_(rpg_4b, **feature, **{ARR + "actor__strategy": "fsdp"})  # the reference follows the actor
    with pytest.raises(RecipeConfigError, match="tested on FSDP2 only") as e:
        validate_recipe(fsdp1)
    message = str(e.value)
    assert needle in message and "actor_rollout_ref.actor.strategy=fsdp and actor_rollout_ref.ref.strategy=fsdp" in message
    assert "actor_rollout_ref.actor.strategy=fsdp2" in message  # the fix
    only_ref = with_(rpg_4b, **feature, **{ARR + "ref__strategy": "fsdp"})
    with pytest.raises(RecipeConfigError, match=r"with actor_rollout_ref\.ref\.strategy=fsdp \(FSDP1\)"):
        validate_recipe(only_ref)


def test_fsdp1_stays_allowed_for_the_other_recipes(rpg_4b):
    validate_recipe(with_(rpg_4b, **{ARR + "actor__strategy": "fsdp"}))
