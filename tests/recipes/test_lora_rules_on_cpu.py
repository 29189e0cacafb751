"""The launcher's LoRA rules (rpg/preflight/lora_rules.py; docs/gpu.md#lora): the adapter rank vLLM serves, checked by
RPG so that a LoRA dry run works without vLLM (verl's own check imports vLLM), and LoRA refused with separate_async
(verl #7495), which rpg-doctor warns about. verl's real `ppo_trainer`, composed once per module."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
from recipe_helpers import RECIPE, cfg_with, run_script

from rpg.launch import RecipeConfigError, build_verl_configs, compose_config, validate
from rpg.preflight import doctor, lora_rules

MODEL = "actor_rollout_ref.model."
MINIMAL = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
    "reward.reward_manager.name=dapo",
]
NO_VLLM = staticmethod(lambda name: None if name == "vllm" else importlib.util.find_spec(name))
WITH_VLLM = staticmethod(lambda name: object() if name == "vllm" else importlib.util.find_spec(name))


@pytest.fixture(scope="module")
def base():
    return compose_config(MINIMAL)


def test_this_environment_has_no_vllm():
    """The dry runs of this folder (the LoRA recipes' golden digests) prove the laptop case only without vLLM."""
    assert importlib.util.find_spec("vllm") is None


@pytest.mark.parametrize("rank, served", [(1, 1), (2, 8), (32, 32), (33, 64), (300, 320), (512, 512)])
def test_vllm_max_lora_rank_is_the_smallest_allowed_rank_at_least_the_adapters(rank, served):
    """verl's get_vllm_max_lora_rank (vllm_rollout/utils.py) by hand: the allowed values 1, 8, ..., 320, 512."""
    assert lora_rules.vllm_lora_rank(rank) == served


def test_verls_validate_config_reads_lora_only_in_its_vllm_rank_check():
    """The copy `config_for_verl_check` hands verl (lora.merge=True) skips that check and nothing else: every line of
    verl's validate_config that names LoRA is one of the lines of the rank check, merge=True zeroes the rank there."""
    from verl.utils.config import validate_config

    lines = [line.strip() for line in inspect.getsource(validate_config).splitlines()]
    lora_lines = [line for line in lines if "lora" in line.lower()]
    assert lora_lines == [
        "# check LoRA rank in vLLM",
        'lora_config = config.actor_rollout_ref.model.get("lora", {})',
        'lora_rank = lora_config.get("rank", 0)',
        "if lora_rank <= 0:",
        'lora_rank = config.actor_rollout_ref.model.get("lora_rank", 0)',
        'if lora_config.get("merge", False):',
        "lora_rank = 0",
        "if lora_rank > 0 and config.actor_rollout_ref.rollout.name == \"vllm\":",
        "from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank",
        "get_vllm_max_lora_rank(lora_rank)",
    ]
    merge = lines.index('if lora_config.get("merge", False):')
    assert lines[merge + 1] == "lora_rank = 0"  # merged: the rank check is skipped


def test_without_vllm_verl_gets_a_copy_with_the_adapter_merged(base):
    cfg = cfg_with(base, {MODEL + "lora_rank": 32})
    view = lora_rules.config_for_verl_check(cfg, find_spec=NO_VLLM)
    assert view is not cfg and view.actor_rollout_ref.model.lora.merge is True
    assert cfg.actor_rollout_ref.model.lora.merge is False  # the run's own config is untouched
    assert lora_rules.config_for_verl_check(cfg, find_spec=WITH_VLLM) is cfg  # vLLM here: verl's own check runs
    assert lora_rules.config_for_verl_check(base, find_spec=NO_VLLM) is base  # no LoRA: nothing to skip
    merged = cfg_with(cfg, {MODEL + "lora.merge": True})
    assert lora_rules.config_for_verl_check(merged, find_spec=NO_VLLM) is merged


def test_a_lora_config_builds_without_vllm(base):
    """The laptop case: before, verl's validate_config ended in vLLM's import error (ValueError: vllm version None)."""
    built = build_verl_configs(cfg_with(base, {MODEL + "lora_rank": 32}))
    assert built.config.actor_rollout_ref.model.lora_rank == 32


@pytest.mark.parametrize("key", ["lora_rank", "lora.rank"])
def test_a_rank_vllm_cannot_serve_is_one_clear_refusal(base, key):
    cfg = cfg_with(base, {MODEL + key: 600})
    with pytest.raises(RecipeConfigError) as e:
        validate(cfg)
    said = str(e.value)
    assert "\n" not in said and "actor_rollout_ref.model.lora_rank=600" in said
    assert "1, 8, 16, 32, 64, 128, 256, 320, 512" in said and "lora.merge=True" in said
    with pytest.raises(RecipeConfigError, match="lora_rank=600"):  # verl's view is never made around a bad rank
        lora_rules.config_for_verl_check(cfg, find_spec=NO_VLLM)


def test_a_merged_adapter_needs_no_vllm_rank(base):
    cfg = cfg_with(base, {MODEL + "lora_rank": 600, MODEL + "lora.merge": True})
    assert lora_rules.lora_problems(cfg) == []


SEPARATE = {  # separate_async with what the recipe rules ask of it (a standalone rollout node, a weight-sync backend)
    "trainer.v1.trainer_mode": "separate_async", "actor_rollout_ref.rollout.nnodes": 1,
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl", "data.train_batch_size": 128,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32, "trainer.v1.separate_async.parameter_sync_step": 4,
}


@pytest.mark.parametrize("lora", [{MODEL + "lora_rank": 32}, {MODEL + "lora.rank": 8},
                                  {MODEL + "lora_adapter_path": "/some/adapter"}])
def test_lora_with_separate_async_is_refused_with_the_verl_issue(base, lora):
    with pytest.raises(RecipeConfigError) as e:
        validate(cfg_with(base, {**SEPARATE, **lora}))
    said = str(e.value)
    assert "trainer.v1.trainer_mode=separate_async" in said and "#7495" in said and "initial policy" in said
    assert "Fix: TRAINER_MODE=colocate_async or sync" in said
    assert ("lora_adapter_path=/some/adapter (LoRA)" in said) == (MODEL + "lora_adapter_path" in lora)


def test_separate_async_without_lora_and_lora_with_other_trainers_are_not_this_rules(base):
    assert lora_rules.separate_async_problem(cfg_with(base, SEPARATE)) is None
    for mode in ("sync", "colocate_async"):
        cfg = cfg_with(base, {"trainer.v1.trainer_mode": mode, MODEL + "lora_rank": 32})
        assert lora_rules.separate_async_problem(cfg) is None
    validate(cfg_with(base, SEPARATE))  # a full-weight separate_async run validates as before


def test_the_doctor_warns_about_lora_with_separate_async(base, monkeypatch):
    line = doctor.lora_async_line(cfg_with(base, {**SEPARATE, MODEL + "lora_rank": 32}))
    assert line.status == "WARN" and "#7495" in line.detail and "colocate_async" in line.fix
    assert doctor.lora_async_line(cfg_with(base, SEPARATE)) is None
    assert doctor.lora_async_line(cfg_with(base, {MODEL + "lora_rank": 32})) is None
    script = RECIPE / "4b" / "run_dapo_2k.sh"
    monkeypatch.setattr(doctor, "recipe_composed",
                        lambda s, env: cfg_with(base, {**SEPARATE, MODEL + "lora_rank": 32}))
    lines = doctor.recipe_lines(script, {}, None)
    assert [(line.status, line.name) for line in lines] == [("WARN", "lora async"), ("FAIL", "4b/run_dapo_2k.sh")]
    assert "invalid LoRA configuration" in lines[1].detail


def test_a_lora_dry_run_of_a_frozen_reference_recipe_ends_without_a_traceback():
    """The issue's laptop case, end to end through bash (no vLLM here): before, verl's validate_config ended in vLLM's
    import error; the one-GPU recipes (recipe/rpg/1gpu/) dry-run in-process in test_dry_run_on_cpu.py."""
    script = RECIPE / "4b/run_rpg_reinforce_ufkl_4k_beta1e-3_noiterref.sh"
    proc = run_script(script, "actor_rollout_ref.model.lora_rank=32", RPG_DRY_RUN="summary", PYTHON=".venv/bin/python")
    assert "Traceback" not in proc.stderr and "vllm version None" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0 and "# lora       rank 32" in proc.stdout, proc.stderr[-2000:]


def test_the_cpu_hf_rollout_takes_a_merged_adapter_only(base):
    """The CPU `hf` rollout loads full weights (rpg/cpu/hf_rollout.py): an unmerged adapter is refused before Ray, not
    at the first weight sync of a started cluster; a merged one validates."""
    hf = cfg_with(base, {"actor_rollout_ref.rollout.name": "hf", MODEL + "lora_rank": 8})
    with pytest.raises(RecipeConfigError) as e:
        validate(hf)
    message = str(e.value)
    assert "actor_rollout_ref.rollout.name=hf" in message and "actor_rollout_ref.model.lora.merge=True" in message
    validate(cfg_with(hf, {MODEL + "lora.merge": True}))
    validate(cfg_with(base, {"actor_rollout_ref.rollout.name": "hf"}))  # full weights: not this rule
