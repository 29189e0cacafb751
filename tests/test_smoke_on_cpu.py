"""Smoke mode (rpg/smoke.py): the overrides compose and pass verl's checks on real recipes, the report's numbers are
exact on a synthetic file-logger log, and the GPU memory sampler is a no-op without a GPU.

The recipes are composed, not run (RPG_PRINT_ARGV=1 gives a script's overrides, as tests/recipes does); the real CPU
smoke run is part of an end-to-end test."""

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "recipes"))
from recipe_helpers import RECIPE, run_script  # noqa: E402

from rpg import smoke  # noqa: E402
from rpg.launch import compose_and_validate  # noqa: E402

# (script, environment, expected smoke prompts): dynamic batches with a per-GPU budget of one maximal sequence need
# 1 prompt × 16 responses on 8 or 2 GPUs; the ×4 budget (authors' *_rf_clip_ppo*) needs 4 sequences per rank: 2
# prompts on 8 GPUs, 1 on 2; the CPU recipe's static micro-batch is its whole batch (16 × 8 per rank).
CASES = [
    ("7b/run_rpg_7b_urkl1e-4.sh", {}, 1),
    ("7b/run_rpg_7b_urkl1e-4.sh", {"N_GPUS": "1", "NNODES": "2"}, 1),
    ("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo.sh", {}, 2),
    ("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo.sh", {"N_GPUS": "1", "NNODES": "2"}, 1),
    ("4b/run_rpg_reinforce_urkl_4k.sh", {}, 1),
    ("4b/run_rpg_reinforce_urkl_4k.sh", {"N_GPUS": "1", "NNODES": "2"}, 1),
    ("cpu/run_rpg_reinforce_urkl.sh", {}, 16),
    ("cpu/run_rpg_reinforce_urkl.sh", {"CPU_RANKS": "2"}, 16),
]


def recipe_overrides(script: str, **env: str) -> list[str]:
    proc = run_script(RECIPE / script, RPG_PRINT_ARGV="1", RPG_DRY_RUN="1", **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["argv"][3:]


KEPT = ("actor_rollout_ref.model.path", "actor_rollout_ref.rollout",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.fsdp_config",
        "actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref", "actor_rollout_ref.actor.use_dynamic_bsz",
        "data.max_prompt_length", "data.max_response_length", "trainer.nnodes", "trainer.n_gpus_per_node",
        "algorithm.filter_groups")  # fmt: skip


IDS = [f"{script}-{'-'.join(env.values()) or 'default'}" for script, env, _ in CASES]


@pytest.mark.parametrize("script,env,prompts", CASES, ids=IDS)
def test_smoke_overrides_pass_verls_checks(script, env, prompts, tmp_path):
    from omegaconf import OmegaConf

    argv = recipe_overrides(script, **env)
    full = compose_and_validate(argv)
    paths = smoke.smoke_paths(full, tmp_path / "it's a ${log}")  # Hydra-quoted verbatim
    for phase, steps in ((smoke.SAVE, 1), (smoke.RESUME, 2)):
        smoked = compose_and_validate(argv + smoke.smoke_overrides(full, paths, phase)).config  # verl's checks too
        world = smoked.trainer.nnodes * smoked.trainer.n_gpus_per_node
        n = smoked.actor_rollout_ref.rollout.n
        assert smoked.data.train_batch_size == smoked.actor_rollout_ref.actor.ppo_mini_batch_size == prompts
        assert prompts * n % world == 0
        assert smoked.trainer.total_training_steps == steps and not smoked.trainer.val_before_train
        # launch 1 saves step 1 (no validation); launch 2 resumes it and validates after step 2
        assert (smoked.trainer.save_freq, smoked.trainer.test_freq, smoked.trainer.resume_mode) == (
            (1, -1, "disable") if phase == smoke.SAVE else (-1, 2, "auto"))
        assert smoked.trainer.default_local_dir == str(paths.ckpts) != full.config.trainer.default_local_dir
        # the recipe's loggers stay (wandb: a missing key shows now), plus verl's file logger
        assert list(smoked.trainer.logger) == list(dict.fromkeys([*full.config.trainer.logger, "console", "file"]))
        assert smoked.data.val_max_samples == max(8, world)
        assert smoked.ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH == str(paths.phase_log(phase))
        for key in KEPT:  # model, engines, ranks, memory settings, token budgets: the recipe's
            assert OmegaConf.select(smoked, key) == OmegaConf.select(full.config, key), key


def test_full_rollout_keeps_the_recipes_batch_and_periodic_and_schedule_free_are_exercised(tmp_path):
    """SMOKE_ROLLOUT=full (GPU only): the recipe's batch, so the rollout reaches its KV-cache and sampler peak; the
    periodic reference refreshes at every step and is checked; schedule-free's checkpoint carries the HF export."""
    argv = recipe_overrides("7b/run_rpg_7b_fkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree.sh") + [
        "actor_rollout_ref.actor.policy_loss.reference=periodic", "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=64",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0"]
    full = compose_and_validate(argv)
    paths = smoke.smoke_paths(full, tmp_path)
    smoked = compose_and_validate(argv + smoke.smoke_overrides(full, paths, smoke.SAVE, rollout="full")).config
    assert smoked.data.train_batch_size == full.config.data.train_batch_size == 512
    assert smoked.actor_rollout_ref.actor.ppo_mini_batch_size == full.config.actor_rollout_ref.actor.ppo_mini_batch_size
    assert smoked.actor_rollout_ref.actor.policy_loss.ref_refresh_steps == 1
    assert smoked.ray_kwargs.ray_init.runtime_env.env_vars[smoke.VERIFY_REFRESH_ENV] == "1"
    assert list(smoked.actor_rollout_ref.actor.checkpoint.save_contents)[-1] == "hf_model"
    assert smoke.smoke_rollout({}) == "small" and smoke.smoke_rollout({"SMOKE_ROLLOUT": "full"}) == "full"
    with pytest.raises(ValueError, match="SMOKE_ROLLOUT='huge' is not valid; use small"):
        smoke.smoke_rollout({"SMOKE_ROLLOUT": "huge"})


def test_prepare_makes_the_folder_drops_stale_logs_and_replaces_only_a_smoke_checkpoint(tmp_path):
    full = compose_and_validate(recipe_overrides("cpu/run_rpg_reinforce_urkl.sh"))
    paths = smoke.smoke_paths(full, tmp_path / "logs")
    paths.root.mkdir()
    for stale in (paths.log, paths.step1_log):
        stale.write_text('{"step": 1, "data": {}}\n')
    assert smoke.prepare(full, paths.root) == paths
    assert not paths.log.exists() and not paths.step1_log.exists() and (paths.ckpts / smoke.MARKER).is_file()
    (paths.ckpts / "global_step_1").mkdir()
    smoke.prepare(full, paths.root)  # a previous smoke checkpoint is replaced
    assert sorted(p.name for p in paths.ckpts.iterdir()) == [smoke.MARKER]
    (paths.ckpts / smoke.MARKER).unlink()
    with pytest.raises(ValueError, match="is not a smoke checkpoint folder"):
        smoke.prepare(full, paths.root)  # a folder it did not make is never deleted


def test_smoke_requested():
    assert smoke.smoke_requested({"SMOKE": "1"}) and not smoke.smoke_requested({})
    with pytest.raises(ValueError, match=r"SMOKE='2' is not valid; use 1"):
        smoke.smoke_requested({"SMOKE": "2"})


def synthetic_log(path: Path) -> None:
    """verl's file-logger lines of a 2-step smoke run: step 1 slow (warm-up), validation after step 2."""
    steps = {
        1: {"timing_s/gen": 30.0, "timing_s/old_log_prob": 4.0, "timing_s/adv": 0.5, "timing_s/update_actor": 10.0,
            "timing_s/update_weights": 2.0, "timing_s/step": 50.0, "actor/perf/max_memory_allocated_gb": 30.0,
            "actor/perf/max_memory_reserved_gb": 34.0, "actor/perf/cpu_memory_used_gb": 100.0},
        2: {"timing_s/gen": 10.0, "timing_s/old_log_prob": 2.0, "timing_s/adv": 0.5, "timing_s/update_actor": 6.0,
            "timing_s/update_weights": 1.0, "timing_s/step": 20.0, "timing_s/testing": 12.0,
            "actor/perf/max_memory_allocated_gb": 31.5, "actor/perf/max_memory_reserved_gb": 33.0,
            "actor/perf/cpu_memory_used_gb": 101.0},
    }  # fmt: skip
    path.write_text("".join(json.dumps({"step": k, "data": v}) + "\n" for k, v in steps.items()))


def synthetic_config(val_rows: int, tmp_path: Path, device: str = "cuda"):
    """The validated 7B recipe's sizes (8 GPUs, 512 prompts × 16, dynamic batches: smoke batch 1) with a local val file
    (rows a scorer reads: the launcher checks them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    val = tmp_path / "val.parquet"
    pq.write_table(pa.table({"data_source": ["math_500"] * val_rows,
                             "reward_model": [{"ground_truth": "1"}] * val_rows}), val)
    argv = recipe_overrides("7b/run_rpg_7b_urkl1e-4.sh")
    return compose_and_validate(argv + [f"data.val_files=['{val}']", "trainer.total_training_steps=400",
                                        "trainer.test_freq=10", "trainer.val_before_train=True",
                                        f"trainer.device={device}"])


def test_summary_numbers_are_exact(tmp_path):
    log = tmp_path / "smoke.jsonl"
    synthetic_log(log)
    full = synthetic_config(3200, tmp_path)
    sampler = smoke.GpuMemorySampler()
    sampler.peaks, sampler.totals = {0: 70 * smoke.GIB, 1: 68 * smoke.GIB}, {0: 80 * smoke.GIB, 1: 80 * smoke.GIB}
    rep = smoke.report(log, full, sampler, wall_s=200.0)
    assert rep.steps == [1, 2] and rep.measured == [2]  # step 1 (warm-up) left out of the means
    assert rep.seconds == {"gen": 10.0, "old_log_prob": 2.0, "adv": 0.5, "update_actor": 6.0, "update_weights": 1.0,
                           "step": 20.0, "testing": 12.0}  # fmt: skip
    assert rep.update_gib == (31.5, 34.0)  # the largest over the steps
    assert rep.scale == 512 and rep.full_steps == 400
    assert rep.validations == 1 + 40  # before training, then steps 10, 20, ..., 400
    assert rep.val_prompts == (8, 3200) and rep.run_s == 82.0
    text = rep.format()
    # step: gen 10 + 512 × (old log-prob 2 + adv 0.5 + update 6) + the rest as measured (20 - 10 - 8.5 = 1.5: weight
    # sync 1 and 0.5 unattributed) = 4363.5 (rollout ×1) .. 9473.5 (rollout ×512)
    # validation: 12 s for 8 prompts, ×400 for 3200 = 4800 s; total 400 × step + 41 × validation
    lo, hi = 400 * 4363.5 + 41 * 12.0, 400 * 9473.5 + 41 * 4800.0
    assert (f"= 400 × 4363.5 s .. 9473.5 s + 41 × 12.0 s .. 4800.0 s = {lo / 3600:.2f} h .. {hi / 3600:.2f} h"
            in text), text  # fmt: skip
    assert "steps × step seconds + validations × validation seconds" in text
    assert "rollout (gen)      10.00 s   memory: 70.0 GiB peak used on a GPU" in text
    assert "update              6.00 s   memory: 31.5 GiB allocated / 34.0 GiB reserved" in text
    assert "validation         12.00 s" in text and "GPU0 70.0/80.0 GiB, GPU1 68.0/80.0 GiB" in text
    assert "start-up and shutdown, 118 s of this run's 200 s" in text


def test_summary_on_cpu_reports_host_memory(tmp_path):
    log = tmp_path / "smoke.jsonl"
    synthetic_log(log)
    text = smoke.summarize(log, synthetic_config(4, tmp_path, device="cpu"), smoke.GpuMemorySampler().start())
    assert "GPU memory is not measured on CPU; peak RSS of this (launcher) process" in text
    assert "machine memory in use at the update 101.00 GiB" in text
    assert "rollout (gen)      10.00 s   memory: not measured" in text and "allocated" not in text
    assert "validation seconds for 4 prompts (smoke: 4): from as measured to ×1" in text


def test_summary_of_a_run_that_logged_no_step(tmp_path):
    log = tmp_path / "smoke.jsonl"
    log.write_text(json.dumps({"step": 0, "data": {"val-core/x/acc/mean@1": 0.5}}) + "\n")
    with pytest.raises(ValueError, match="no training step logged"):
        smoke.summarize(log, synthetic_config(4, tmp_path))


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a machine with a GPU driver")
def test_sampler_is_a_no_op_on_cpu():
    sampler = smoke.GpuMemorySampler(interval_s=0.01).start()
    sampler.stop()
    assert sampler.backend is None and sampler._thread is None and sampler.peaks == {}


def test_sampler_is_a_no_op_without_nvml_or_nvidia_smi(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML library
    monkeypatch.setattr(smoke.shutil, "which", lambda name: None)  # no nvidia-smi
    sampler = smoke.GpuMemorySampler(interval_s=0.01).start()
    sampler.stop()
    assert sampler.backend is None and sampler._thread is None and sampler.peaks == {} and sampler.totals == {}


def test_smoke_dry_run_forces_every_mode_the_recipe_selects(monkeypatch, tmp_path):
    """`SMOKE=1 RPG_DRY_RUN=1` of the EMA script with an adaptive β, in-process: the smoke launch forces what the rows
    of the run-mode table say (rpg/modes.py): the EMA period 1 (the recipe's 16 would never blend in a 1-step launch),
    and every rank's check of each blend (`VERIFY_REFRESH_ENV`)."""
    from omegaconf import OmegaConf

    from rpg import launch, modes

    monkeypatch.setenv("SMOKE", "1")
    monkeypatch.setenv("RPG_DRY_RUN", "1")
    monkeypatch.setenv("RPG_SMOKE_DIR", str(tmp_path))
    args = recipe_overrides("4b/run_rpg_reinforce_urkl_4k_ema.sh") + [
        "actor_rollout_ref.actor.policy_loss.kl_control=adaptive", "actor_rollout_ref.actor.policy_loss.kl_target=1e-3"]
    extra, run = launch.smoke_setup(args, dry_run=True)
    assert run.full.rpg.ref_ema_period == 16  # the recipe's, before the smoke's
    smoked = compose_and_validate(args + extra).config
    rows = modes.selected(smoked.actor_rollout_ref.actor.policy_loss)
    assert [r.name for r in rows] == ["ema", "adaptive"]
    forced = [o for r in rows for o in r.smoke]
    assert forced == ["+actor_rollout_ref.actor.policy_loss.ref_ema_period=1"]
    for override in forced:
        key, value = override.lstrip("+").split("=")
        assert str(OmegaConf.select(smoked, key)) == value
    assert smoked.ray_kwargs.ray_init.runtime_env.env_vars[smoke.VERIFY_REFRESH_ENV] == "1"
