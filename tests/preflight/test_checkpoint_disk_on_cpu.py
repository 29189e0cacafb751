"""The free-disk check before a launch that saves (rpg/preflight/disk.py): the checkpoint size from the model's
parameter count, the copies on disk at once, and the refusal's numbers and fix."""

import functools

import pytest

from rpg.launch import compose_and_validate
from rpg.preflight.disk import GB, estimate, problem, saves
from rpg.preflight.memory import load_model_shape
from rpg.tools import dry_run_digest as dd

MODEL = "Qwen/Qwen2.5-Math-7B"  # in the shipped table of recipe models
URKL_7B = "7b/run_rpg_7b_urkl1e-4.sh"  # AdamW, fp32 weights, save every 20 of 400 steps, keep 1
DIR = "trainer.default_local_dir=/tmp/rpg-disk-test"


@functools.lru_cache(maxsize=None)
def validated(script: str = URKL_7B, *extra: str):
    """The validated recipe with `extra` overrides (what the launcher checks the disk of)."""
    return compose_and_validate([*dd.script_overrides(dd.RECIPE / script), DIR, *extra])


def test_the_estimate_counts_weights_optimizer_states_and_the_periodic_reference():
    p = load_model_shape(MODEL).param_count()
    est = estimate(validated())
    assert est.parts == {"actor weights": 4 * p, "optimizer states (2 fp32 per parameter)": 8 * p}
    assert est.copies == 2 and est.needed == 2 * 12 * p  # keep 1, plus the one being written
    assert 80 * GB < est.one < 100 * GB  # ~91 GB for a 7B model with AdamW (issue 25)
    p4 = load_model_shape("Qwen/Qwen3-4B").param_count()
    periodic = validated("4b/run_rpg_reinforce_urkl_4k_periodic.sh", "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16",
                         "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]")
    assert estimate(periodic).parts["periodic reference weights"] == 2 * p4
    assert estimate(periodic).parts["HF export"] == 4 * p4
    kept = validated(URKL_7B, "trainer.max_actor_ckpt_to_keep=null")
    assert estimate(kept).copies == saves(kept.config.trainer) == 20  # every save kept
    ema = validated("4b/run_rpg_reinforce_urkl_4k_ema.sh")  # the EMA reference saves its fp32 weights too
    assert estimate(ema).parts["EMA reference weights"] == 4 * p4
    assert estimate(validated(), n_params=10).parts == {"actor weights": 40, "optimizer states (2 fp32 per parameter)": 80}


def test_a_disk_too_small_is_refused_with_the_numbers_and_the_fix():
    msg = problem(validated(), free_bytes=50 * GB)
    for part in ("trainer.default_local_dir=/tmp/rpg-disk-test (CKPTS_DIR) has 50.0 GB free", "2 × (actor weights",
                 "trainer.max_actor_ckpt_to_keep=1 + 1 being written",
                 "Set CKPTS_DIR to a disk with at least", "trainer.save_freq=-1"):  # fmt: skip
        assert part in msg, (part, msg)
    assert "keep fewer checkpoints" not in msg  # max_actor_ckpt_to_keep is 1 already: no fix that changes nothing
    msg = problem(validated(URKL_7B, "trainer.max_actor_ckpt_to_keep=null"), free_bytes=50 * GB)
    assert "keep fewer checkpoints (trainer.max_actor_ckpt_to_keep=1: " in msg, msg
    assert problem(validated(), free_bytes=10_000 * GB) is None
    assert problem(validated(URKL_7B, "trainer.save_freq=-1"), free_bytes=0) is None  # a run that saves nothing needs no room


def test_a_lora_checkpoint_counts_optimizer_states_of_the_adapter_and_its_snapshot():
    """verl saves the whole model (base + adapter, unless checkpoint.save_lora_only) but optimizer states only for the
    adapter (the one trained tensor set); the periodic reference under LoRA saves the adapter's fp32 snapshot."""
    from rpg.preflight.memory import lora_modules

    shape = load_model_shape("Qwen/Qwen3-4B")
    p, a = shape.param_count(), shape.lora_params(32, lora_modules("all-linear"))
    lora = validated("1gpu/run_rpg_reinforce_urkl_4k_lora.sh")
    parts = estimate(lora).parts
    assert parts["actor weights"] == 4 * p
    assert parts["optimizer states (2 fp32 per parameter)"] == 8 * a  # not 8 * p: the base is frozen
    pl = "actor_rollout_ref.actor.policy_loss"
    periodic = validated("1gpu/run_rpg_reinforce_urkl_4k_lora.sh", f"{pl}.reference=periodic",
                         f"{pl}.ref_refresh_steps=64", "actor_rollout_ref.actor.use_kl_loss=True",
                         "actor_rollout_ref.actor.kl_loss_coef=0")
    assert estimate(periodic).parts["periodic reference adapter snapshot"] == 4 * a  # fp32, adapter-sized
    only = validated("1gpu/run_rpg_reinforce_urkl_4k_lora.sh", "+actor_rollout_ref.actor.checkpoint.save_lora_only=True")
    assert estimate(only).parts["actor weights"] == 4 * a
