"""The top-k KL's options (policy_loss.kl_estimator/kl_topk/kl_topk_tail, docs/losses.md#topk-kl): accepted for every
RPG loss and reference mode where they can run, each refusal naming the setting, the value, the reason and the fix,
before Ray starts (verl's real `ppo_trainer`, composed once per module)."""

from __future__ import annotations

import json

import pytest
from recipe_helpers import as_launched, cfg_with, refused

from rpg.launch import compose_config, validate_rpg
from rpg.loss_config import RPGPolicyLossConfig
from rpg.loss_table import LOSSES

ACTOR = "actor_rollout_ref.actor."
PL = ACTOR + "policy_loss."
MINIMAL = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "algorithm.adv_estimator=rpg",
    f"{PL}loss_mode=rpg_urkl",
    f"{PL}_target_=rpg.RPGPolicyLossConfig",
    f"{ACTOR}clip_ratio_low=0.2",
    f"{ACTOR}clip_ratio_high=0.28",
    f"{ACTOR}clip_ratio_c=10.0",
]
TOPK = {PL + "kl_estimator": "topk"}
FROZEN = {PL + "reference": "frozen", ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0}


@pytest.fixture(scope="module")
def base():
    return compose_config(MINIMAL)


def _topk_ok(loss: str) -> dict:
    """The settings that let `loss` run with the top-k KL (REINFORCE branches on A)."""
    extra = {PL + "loss_mode": loss, **TOPK}
    if "branch_on" in LOSSES[loss].options:
        extra[PL + "branch_on"] = "advantage"
    if LOSSES[loss].needs_reference:
        extra.update({ACTOR + "use_kl_loss": True, ACTOR + "kl_loss_coef": 0.0})
    return extra


@pytest.mark.parametrize("loss, reference", [*((loss, "iterative") for loss in sorted(LOSSES)),
                                             *(("rpg_kl_rkl", r) for r in ("frozen", "periodic", "ema"))])
def test_every_rpg_loss_and_reference_mode_accepts_topk(base, loss, reference):
    updates = _topk_ok(loss) | {PL + "kl_topk": 16, PL + "kl_topk_tail": "bucket"}
    if reference != "iterative":
        updates.update(FROZEN | {PL + "reference": reference})
    if reference == "periodic":
        updates[PL + "ref_refresh_steps"] = 4
    if reference == "ema":
        updates["actor_rollout_ref.ref.fsdp_config.model_dtype"] = "fp32"
    settings = as_launched(validate_rpg, cfg_with(base, updates))
    assert settings.topk and settings.kl_topk == 16 and settings.kl_topk_tail == "bucket"


@pytest.mark.parametrize("updates, names", [
    ({PL + "loss_mode": "rpg_reinforce_urkl"}, ["branch_on='effective_advantage'", "no per-token C_KL",
                                                "branch_on=advantage"]),
    ({PL + "kl_placement": "inside_clip"}, ["kl_placement='inside_clip'", "sampled token's ratio", "additive"]),
    ({PL + "kl_clamp": 10.0}, ["kl_clamp=10.0", "one-sample surrogate", "Remove it"]),
    ({PL + "loss_mode": "rpg_reinforce_hardclip_urkl", PL + "kl_ratio": "raw"}, ["kl_ratio='raw'", "no C_KL"]),
    ({PL + "kl_topk": 0}, ["kl_topk=0", "integer ≥ 1"]),
    ({PL + "kl_topk": 2.5}, ["kl_topk=2.5", "integer ≥ 1"]),
    ({PL + "kl_topk_tail": "none"}, ["kl_topk_tail='none'", "'sampled', 'bucket'"]),
    ({PL + "kl_estimator": "full"}, ["kl_estimator='full'", "'sampled', 'topk'"]),
])  # fmt: skip
def test_loss_settings_that_cannot_take_an_analytic_kl_are_refused(base, updates, names):
    message = refused(cfg_with(base, TOPK | updates))
    for name in names:
        assert name in message, message


@pytest.mark.parametrize("updates, names", [
    ({"actor_rollout_ref.model.use_fused_kernels": True}, ["use_fused_kernels=True", "never materialise"]),
    ({ACTOR + "pad_to_length": True}, ["actor.pad_to_length=True", "pad_to_length=False"]),
    ({"actor_rollout_ref.ref.pad_to_length": True}, ["ref.pad_to_length=True"]),
    ({ACTOR + "ulysses_sequence_parallel_size": 2}, ["actor.ulysses_sequence_parallel_size=2", "sliced"]),
    ({"distillation.enabled": True}, ["distillation.enabled=True", "distillation_use_topk"]),
    ({"algorithm.rollout_correction.bypass_mode": True}, ["bypass_mode=True", "no top-k", "reference='iterative'"]),
    ({"trainer.use_v1": False}, ["trainer.use_v1=False", "TransferQueue"]),
    ({"trainer.v1.trainer_mode": "separate_async"}, ["trainer_mode=separate_async", "colocate_async"]),
    ({ACTOR + "strategy": "megatron"}, ["strategy=megatron", "FSDPEngineWithLMHead"]),
])  # fmt: skip
def test_engine_settings_the_hook_cannot_run_with_are_refused(base, updates, names):
    message = refused(cfg_with(base, TOPK | updates))
    for name in names:
        assert name in message, message
    # the same setting is fine with the sampled estimator
    as_launched(validate_rpg, cfg_with(base, updates))


def test_bypass_mode_with_a_reference_model_is_accepted(base):
    cfg = cfg_with(base, TOPK | FROZEN | {"algorithm.rollout_correction.bypass_mode": True})
    assert as_launched(validate_rpg, cfg).topk


def test_k_above_the_vocabulary_is_refused_where_the_vocabulary_is_known(base, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "vocab_size": 40}))  # fmt: skip
    model = {"actor_rollout_ref.model.path": str(tmp_path)}
    # the folder has no tokenizer, which verl's model build loads: the typed loss is built without the folder
    k41, k40 = (cfg_with(base, TOPK | {PL + "kl_topk": k}) for k in (41, 40))
    message = refused(cfg_with(k41, model), k41)
    assert "kl_topk=41" in message and "(40 tokens)" in message and "kl_topk ≤ 40" in message
    assert as_launched(validate_rpg, cfg_with(k40, model), k40).kl_topk == 40


def test_topk_options_without_topk_and_on_verl_losses_are_refused():
    with pytest.raises(ValueError, match=r"kl_topk=8 has no effect.*acts only with kl_estimator='topk'"):
        RPGPolicyLossConfig(loss_mode="rpg_urkl", kl_topk=8)
    with pytest.raises(ValueError, match=r"kl_topk_tail='bucket' has no effect"):
        RPGPolicyLossConfig(loss_mode="rpg_kl_rkl", kl_topk_tail="bucket")
    with pytest.raises(ValueError, match=r"kl_estimator='topk' has no effect on verl's loss_mode='vanilla'"):
        RPGPolicyLossConfig(loss_mode="vanilla", kl_estimator="topk")
    assert not RPGPolicyLossConfig(loss_mode="rpg_urkl").topk  # the default: the paper's sampled estimator


def test_the_dry_run_summary_names_the_estimator_and_the_supports_size(base):
    from rpg.launch import validate
    from rpg.preflight.summary import summary_lines

    cfg = cfg_with(base, TOPK | FROZEN | {PL + "kl_topk": 16, PL + "loss_mode": "rpg_fkl", "data.train_batch_size": 4,
                                          "actor_rollout_ref.rollout.n": 2, "data.max_prompt_length": 100,
                                          "data.max_response_length": 28,
                                          "reward.reward_kwargs.overlong_buffer_cfg.len": 7})  # fmt: skip
    line = [x for x in summary_lines(validate(cfg), []) if x.startswith("# KL")]
    gib = 8 * 16 * 4 * 2 * 128 / 2**30
    assert line == [f"# KL         top-k, k 16 (π_ref's top-k), sampled tail, forward KL; support 128 B per token: up "
                    f"to {gib:.1f} GiB per step (host, TransferQueue)"]
    assert not [x for x in summary_lines(validate(base), []) if x.startswith("# KL")]  # the sampled estimator: none


def test_a_refusal_of_the_options_names_the_node_once(base):
    """RPGPolicyLossConfig's own refusals reach the launcher as its error, the config node named once (its messages
    mostly start with the node already: no 'actor_rollout_ref.actor.policy_loss: actor_rollout_ref.actor...')."""
    message = refused(cfg_with(base, {PL + "loss_mode": "rpg_reinforce_urkl", **TOPK}))
    assert message.startswith(PL + "branch_on='effective_advantage' cannot run with kl_estimator='topk'"), message
    assert message.count("actor_rollout_ref.actor.policy_loss") == message.count(PL + "branch_on"), message
