"""The free-disk check before a launch that saves (rpg/preflight/disk.py): the checkpoint size from the model's
parameter count, the copies on disk at once, and the refusal's numbers and fix."""

import pytest
from omegaconf import OmegaConf

from rpg.preflight.disk import GB, estimate, problem, saves
from rpg.preflight.memory import load_model_shape

MODEL = "Qwen/Qwen2.5-Math-7B"  # in the shipped table of recipe models


def config(**trainer):
    return OmegaConf.create({
        "actor_rollout_ref": {
            "model": {"path": MODEL},
            "actor": {"checkpoint": {"save_contents": ["model", "optimizer", "extra"]}, "optim": {"optimizer": "AdamW"},
                      "fsdp_config": {"model_dtype": "fp32"}, "policy_loss": {"reference": "iterative"}},
            "ref": {"fsdp_config": {"model_dtype": "bf16"}}},
        "trainer": {"save_freq": 20, "total_training_steps": 400, "max_actor_ckpt_to_keep": 1,
                    "default_local_dir": "/tmp/rpg-disk-test", **trainer},
    })  # fmt: skip


def test_the_estimate_counts_weights_optimizer_states_and_the_periodic_reference():
    p = load_model_shape(MODEL).param_count()
    est = estimate(config())
    assert est.parts == {"actor weights": 4 * p, "optimizer states (2 fp32 per parameter)": 8 * p}
    assert est.copies == 2 and est.needed == 2 * 12 * p  # keep 1, plus the one being written
    assert 80 * GB < est.one < 100 * GB  # ~91 GB for a 7B model with AdamW (issue 25)
    cfg = config()
    cfg.actor_rollout_ref.actor.policy_loss.reference = "periodic"
    cfg.actor_rollout_ref.actor.checkpoint.save_contents.append("hf_model")
    assert estimate(cfg).parts["periodic reference weights"] == 2 * p and estimate(cfg).parts["HF export"] == 4 * p
    assert estimate(config(max_actor_ckpt_to_keep=None)).copies == saves(config()) == 20  # every save kept
    cfg = config()  # the EMA reference saves its fp32 weights too (docs/reference-modes.md#ema)
    cfg.actor_rollout_ref.actor.policy_loss.reference = "ema"
    cfg.actor_rollout_ref.ref.fsdp_config.model_dtype = "fp32"
    assert estimate(cfg).parts["EMA reference weights"] == 4 * p


def test_a_disk_too_small_is_refused_with_the_numbers_and_the_fix():
    msg = problem(config(), free_bytes=50 * GB)
    for part in ("trainer.default_local_dir=/tmp/rpg-disk-test (CKPTS_DIR) has 50.0 GB free", "2 × (actor weights",
                 "trainer.max_actor_ckpt_to_keep=1 + 1 being written",
                 "Set CKPTS_DIR to a disk with at least", "trainer.save_freq=-1"):  # fmt: skip
        assert part in msg, (part, msg)
    assert "keep fewer checkpoints" not in msg  # max_actor_ckpt_to_keep is 1 already: no fix that changes nothing
    msg = problem(config(max_actor_ckpt_to_keep=None), free_bytes=50 * GB)
    assert "keep fewer checkpoints (trainer.max_actor_ckpt_to_keep=1: " in msg, msg
    assert problem(config(), free_bytes=10_000 * GB) is None
    assert problem(config(save_freq=-1), free_bytes=0) is None  # a run that saves nothing needs no room
