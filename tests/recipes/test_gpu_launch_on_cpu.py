"""The GPU side of the launcher, checked without a GPU: FSDP1 refused where untested; the per-GPU memory plan printed
once and refused over budget; what a local launch needs.

FSDP2 and a plan within 80 GiB for every GPU recipe are checked in test_dry_run_on_cpu.py, with every other check of
every script (each composed once). The rules here are checked on copies of one composed config.
"""

from __future__ import annotations

import sys

import pytest
from recipe_helpers import RECIPE, SCRIPTS_4B, SCRIPTS_7B, as_launched, cfg_with, overrides, run_script, validated

from rpg.launch import RecipeConfigError, validate, validate_recipe
from rpg.preflight.gpu import check_gpu_launch, check_memory_plan


@pytest.fixture(scope="module")
def rpg_4b():
    return validated(RECIPE / "4b" / "run_rpg_urkl_2k.sh").config


# ---- 1. FSDP2 where tested ---------------------------------------------------------------------------------------------
def test_the_gpu_scripts_are_found():
    assert (len(SCRIPTS_7B), len(SCRIPTS_4B)) == (60, 35)  # the authors' 60; the paper's 4B rows, async, EMA, β, seq, GSPO, top-k


ARR = "actor_rollout_ref__"
PERIODIC = {ARR + "actor__policy_loss__reference": "periodic", ARR + "actor__use_kl_loss": True,
            ARR + "actor__kl_loss_coef": 0.0}  # fmt: skip
SCHEDULE_FREE = {ARR + "actor__optim__optimizer_impl": "schedulefree",
                 ARR + "actor__optim__optimizer": "AdamWScheduleFree", "trainer__v1__trainer_mode": "schedule_free_sync"}


@pytest.mark.parametrize("feature, needle", [(PERIODIC, "policy_loss.reference=periodic"),
                                             (SCHEDULE_FREE, "schedule-free AdamW")])  # fmt: skip
def test_fsdp1_is_refused_for_the_periodic_reference_and_schedule_free(rpg_4b, feature, needle):
    validate_recipe(cfg_with(rpg_4b, **feature))  # on FSDP2: accepted
    fsdp1 = cfg_with(rpg_4b, **feature, **{ARR + "actor__strategy": "fsdp"})  # the reference follows the actor
    with pytest.raises(RecipeConfigError, match="tested on FSDP2 only") as e:
        validate_recipe(fsdp1)
    message = str(e.value)
    assert needle in message and "actor_rollout_ref.actor.strategy=fsdp and actor_rollout_ref.ref.strategy=fsdp" in message
    assert "actor_rollout_ref.actor.strategy=fsdp2" in message  # the fix
    only_ref = cfg_with(rpg_4b, **feature, **{ARR + "ref__strategy": "fsdp"})
    with pytest.raises(RecipeConfigError, match=r"with actor_rollout_ref\.ref\.strategy=fsdp \(FSDP1\)"):
        validate_recipe(only_ref)


def test_fsdp1_stays_allowed_for_the_other_recipes(rpg_4b):
    validate_recipe(cfg_with(rpg_4b, **{ARR + "actor__strategy": "fsdp"}))


# ---- 2. The memory plan ----------------------------------------------------------------------------------------------
PLAN_LINE = "[rpg] GPU memory plan (per GPU, "
UTIL = "actor_rollout_ref__rollout__gpu_memory_utilization"


@pytest.fixture(scope="module")
def dapo_7b():
    return validated(RECIPE / "7b" / "run_dapo_7b.sh").config


def test_an_over_budget_7b_run_is_refused_naming_the_setting(dapo_7b, capsys):
    cfg = cfg_with(dapo_7b, **{UTIL: 0.95})
    with pytest.raises(RecipeConfigError, match="GPU memory plan over budget") as e:
        check_memory_plan(validate(cfg), budget_gib=80)
    message = str(e.value)
    assert "rollout phase needs about" in message
    assert "lower actor_rollout_ref.rollout.gpu_memory_utilization from 0.95 to 0.80 or below" in message
    assert "optimizer_offload=True" in message  # the other ways to fit
    assert "set RPG_MEMORY_PLAN=warn to launch anyway" in message  # the opt-out of a user who measured
    assert capsys.readouterr().err.count(PLAN_LINE) == 1  # the line comes first, once


def test_the_opt_out_lets_a_dry_run_over_budget_through_with_warnings(monkeypatch, capsys, tmp_path):
    """`RPG_MEMORY_PLAN=warn RPG_DRY_RUN=1 bash <7b script> ...=0.95` (in-process through `rpg.launch.main`)."""
    from rpg import launch

    monkeypatch.setattr(sys, "argv", ["rpg.launch"])
    monkeypatch.chdir(tmp_path)
    for name, value in {"RPG_DRY_RUN": "1", "GPU_MEMORY_GIB": "80", "RPG_MEMORY_PLAN": "warn"}.items():
        monkeypatch.setenv(name, value)
    for name in ("RAY_ADDRESS", "SMOKE"):
        monkeypatch.delenv(name, raising=False)
    launch.main(overrides(RECIPE / "7b" / "run_dapo_7b.sh") + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.95"])
    out, err = capsys.readouterr()
    assert "gpu_memory_utilization: 0.95" in out  # the dry run went through to the YAML
    assert err.count(PLAN_LINE) == 1 and "[rpg] warning (RPG_MEMORY_PLAN=warn, going on): GPU memory plan: the " \
        "rollout phase needs about" in err
    monkeypatch.setenv("RPG_MEMORY_PLAN", "ignore")
    with pytest.raises(RecipeConfigError, match="RPG_MEMORY_PLAN='ignore' is not valid; choose one of: enforce warn"):
        check_memory_plan(validated(RECIPE / "7b" / "run_dapo_7b.sh"), budget_gib=80)


def test_the_budget_comes_from_gpu_memory_gib(monkeypatch, capsys):
    monkeypatch.setenv("GPU_MEMORY_GIB", "141")
    check_memory_plan(validated(RECIPE / "7b" / "run_dapo_7b.sh"))
    assert "budget 141.0 GiB" in capsys.readouterr().err
    monkeypatch.setenv("GPU_MEMORY_GIB", "lots")
    with pytest.raises(RecipeConfigError, match="GPU_MEMORY_GIB='lots' is not a positive number"):
        check_memory_plan(validated(RECIPE / "7b" / "run_dapo_7b.sh"))


def test_an_unknown_model_gets_one_line_saying_why_no_plan(dapo_7b, tmp_path, capsys):
    cfg = validate(cfg_with(dapo_7b, actor_rollout_ref__model__path=str(tmp_path / "no-model")))
    capsys.readouterr()  # verl's validation line
    assert check_memory_plan(cfg, budget_gib=80) is None
    err = capsys.readouterr().err
    assert err.startswith("[rpg] GPU memory plan: not computed: ") and err.count("\n") == 1
    assert "actor_rollout_ref.model.path=" in err


def test_cpu_runs_get_no_plan_line(capsys):
    cfg = validated(RECIPE / "cpu" / "run_rpg_ufkl.sh")
    capsys.readouterr()
    check_gpu_launch(cfg, dry_run=True, local=True)
    assert capsys.readouterr().err == ""


def test_dry_run_prints_the_plan_once(monkeypatch, capsys, tmp_path):
    """`RPG_DRY_RUN=1 bash <7b script>` in-process through `rpg.launch.main` (Hydra's entry, as the shell runs it): the
    shipped settings plan within 80 GiB, one plan line (the real shell path runs in the test below)."""
    from rpg import launch

    monkeypatch.setattr(sys, "argv", ["rpg.launch"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RPG_DRY_RUN", "1")
    monkeypatch.setenv("GPU_MEMORY_GIB", "80")
    for name in ("RAY_ADDRESS", "SMOKE"):
        monkeypatch.delenv(name, raising=False)
    launch.main(overrides(RECIPE / "7b" / "run_dapo_7b.sh"))
    out, err = capsys.readouterr()
    assert out.strip() and err.count(PLAN_LINE) == 1, err[-3000:]
    assert "[rpg] GPU memory plan (per GPU, Qwen/Qwen2.5-Math-7B, budget 80.0 GiB): rollout 72.0 GiB" in err


def test_real_dry_run_prints_the_plan_once_and_refuses_over_budget(tmp_path):
    """`RPG_DRY_RUN=1 bash <7b script> ...gpu_memory_utilization=0.95`: the plan once, and the dry run fails."""
    script = RECIPE / "7b" / "run_dapo_7b.sh"
    env = {"RPG_DRY_RUN": "1", "PYTHON": sys.executable, "GPU_MEMORY_GIB": "80"}
    over = run_script(script, "actor_rollout_ref.rollout.gpu_memory_utilization=0.95", **env)
    assert over.returncode != 0 and over.stdout == ""
    assert over.stderr.count(PLAN_LINE) == 1
    assert "gpu_memory_utilization from 0.95 to 0.80 or below" in over.stderr


# ---- 3. SMOKE=1 ------------------------------------------------------------------------------------------------------
def test_smoke_dry_run_of_a_7b_recipe_prints_the_smoke_config_and_the_plan(monkeypatch, capsys, tmp_path):
    """`SMOKE=1 RPG_DRY_RUN=1`, in-process through `rpg.launch.main` (Hydra's entry, as the shell runs it)."""
    import yaml

    from rpg import launch, smoke

    script = RECIPE / "7b" / "run_rpg_7b_urkl1e-4.sh"
    monkeypatch.setattr(sys, "argv", ["rpg.launch"])
    monkeypatch.chdir(tmp_path)
    for name, value in {"RPG_DRY_RUN": "1", "SMOKE": "1", "GPU_MEMORY_GIB": "80", "RPG_SMOKE_DIR": "smoke-logs"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    launch.main(overrides(script))
    out, err = capsys.readouterr()
    cfg = yaml.safe_load(out)
    full = validated(script).config
    batch = smoke.smoke_batch_size(full)
    assert batch < full.data.train_batch_size == 512
    assert cfg["trainer"]["total_training_steps"] == smoke.SMOKE_STEPS == 2
    assert cfg["data"]["train_batch_size"] == cfg["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == batch
    # the dry run shows launch 2 (resume the smoke checkpoint, step 2, validation); the recipe's loggers stay
    assert cfg["trainer"]["save_freq"] == -1 and cfg["trainer"]["resume_mode"] == "auto"
    assert cfg["trainer"]["logger"] == ["console", "wandb", "file"]
    log = tmp_path / "smoke-logs" / "run_rpg_7b_urkl1e-4.jsonl"
    assert cfg["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["VERL_FILE_LOGGER_PATH"] == str(log)
    assert cfg["trainer"]["default_local_dir"] == str(tmp_path / "smoke-logs" / "ckpts" / "run_rpg_7b_urkl1e-4")
    assert cfg["actor_rollout_ref"]["rollout"]["gpu_memory_utilization"] == 0.75  # the recipe's settings stay
    assert err.count(PLAN_LINE) == 2 and "budget 80.0 GiB" in err  # one per launch: the dry run shows both
    assert f"[rpg] smoke run (SMOKE=1), launch 2 of 2: 2 steps of {batch} prompts, metrics to {log}" in err
    assert list(tmp_path.iterdir()) == []  # a dry run makes no folder


def test_a_bad_smoke_value_is_refused(monkeypatch):
    from rpg.launch import smoke_setup

    monkeypatch.setenv("SMOKE", "maybe")
    with pytest.raises(RecipeConfigError, match="SMOKE='maybe' is not valid; use 1"):
        smoke_setup([], dry_run=True)


def test_smoke_settings_are_passed_on_to_the_launch_and_to_ray_jobs():
    import json

    proc = run_script(RECIPE / "7b" / "run_dapo_7b.sh", RPG_PRINT_ARGV="1", SMOKE="1", RPG_SMOKE_DIR="/tmp/smoke",
                      GPU_MEMORY_GIB="141", RPG_MEMORY_PLAN="warn")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)["env"]  # the environment a local run gets and a Ray job receives
    keys = ("SMOKE", "RPG_SMOKE_DIR", "GPU_MEMORY_GIB", "RPG_MEMORY_PLAN")
    assert {k: env.get(k) for k in keys} == {"SMOKE": "1", "RPG_SMOKE_DIR": "/tmp/smoke", "GPU_MEMORY_GIB": "141",
                                             "RPG_MEMORY_PLAN": "warn"}


# ---- 4. Interpreter and engines --------------------------------------------------------------------------------------
@pytest.fixture
def repo_with_a_venv(tmp_path):
    """A copy of the launcher (common.sh, one 7b and one cpu script, rpg.preflight.recipe_argv and the modules it
    imports) in a checkout whose .venv/bin/python exists: it runs this test's interpreter and leaves a mark when run."""
    import shutil
    import stat

    from recipe_helpers import REPO

    recipes = ("recipe/rpg/common.sh", "recipe/rpg/7b/run_dapo_7b.sh", "recipe/rpg/cpu/run_dapo.sh")
    launcher = (
        "rpg/__init__.py",
        "rpg/modes.py",
        "rpg/preflight/__init__.py",
        "rpg/preflight/recipe_argv.py",
        "rpg/preflight/ray_submit.py",
    )
    for rel in (*recipes, *launcher):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/bin/sh\ntouch "{tmp_path}/venv-used"\nexec "{sys.executable}" "$@"\n')
    venv_python.chmod(venv_python.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def test_gpu_recipes_never_run_the_repositorys_venv(repo_with_a_venv):
    import json

    gpu = run_script(repo_with_a_venv / "recipe/rpg/7b/run_dapo_7b.sh", RPG_PRINT_ARGV="1")
    assert gpu.returncode == 0, gpu.stderr
    assert json.loads(gpu.stdout)["argv"][0] == "python3"
    assert not (repo_with_a_venv / "venv-used").exists()
    chosen = run_script(repo_with_a_venv / "recipe/rpg/7b/run_dapo_7b.sh", RPG_PRINT_ARGV="1", PYTHON=sys.executable)
    assert json.loads(chosen.stdout)["argv"][0] == sys.executable  # PYTHON wins
    cpu = run_script(repo_with_a_venv / "recipe/rpg/cpu/run_dapo.sh", RPG_PRINT_ARGV="1")
    assert cpu.returncode == 0, cpu.stderr
    assert json.loads(cpu.stdout)["argv"][0] == str(repo_with_a_venv / ".venv" / "bin" / "python")  # CPU keeps it


def _spec(missing: set):
    return lambda name: None if name in missing else object()


def _node(gpus: int = 8):
    from rpg.preflight.gpu_probe import NodeProbe

    return NodeProbe(driver="580.65.06", driver_cuda=(13, 0), gpu_total_bytes=[80 << 30] * gpus)


@pytest.mark.parametrize("missing, gpus, needles", [
    (set(), 8, []),
    ({"vllm"}, 8, ["actor_rollout_ref.rollout.name=vllm, but vllm cannot be imported",
                   "pip install -r requirements-gpu.txt"]),
    ({"flash_attn"}, 8, ["attn_implementation=flash_attention_2 (verl's default) needs flash-attn",
                         'FLASH_ATTN_CUDA_ARCHS="80;90" pip install --no-build-isolation']),
    (set(), 4, ["trainer.n_gpus_per_node=8 (recipe knob N_GPUS), but the NVIDIA driver shows 4 GPU(s)",
                "Fix: N_GPUS=4"]),
])  # fmt: skip
def test_what_a_local_launch_needs(dapo_7b, missing, gpus, needles):
    """Every message of the driver, flash-attn's extension and the probe's crash: tests/preflight/test_gpu_probe."""
    from rpg.preflight.gpu import runtime_problems

    problems = runtime_problems(dapo_7b, find_spec=_spec(missing), node=_node(gpus), torch_cuda="13.0")
    assert len(problems) == len(needles) // 2
    for needle in needles:
        assert needle in "\n".join(problems)


def test_flash_attn_is_not_needed_with_another_attention(dapo_7b):
    from rpg.preflight.gpu import runtime_problems

    sdpa = cfg_with(dapo_7b, actor_rollout_ref__model__override_config__attn_implementation="sdpa")
    assert runtime_problems(sdpa, find_spec=_spec({"flash_attn"}), node=_node(), torch_cuda="13.0") == []


def test_a_local_launch_refuses_what_a_dry_run_warns_about(monkeypatch, capsys):
    from rpg.preflight import gpu

    dapo_7b = validated(RECIPE / "7b" / "run_dapo_7b.sh")
    monkeypatch.setattr(gpu.importlib.util, "find_spec", _spec({"vllm", "flash_attn"}))
    monkeypatch.setattr(gpu, "probe", lambda what: _node(2))
    monkeypatch.setattr(gpu, "torch_cuda_version", lambda: "13.0")
    monkeypatch.setenv("GPU_MEMORY_GIB", "80")
    gpu.check_gpu_launch(dapo_7b, dry_run=True, local=True)
    err = capsys.readouterr().err
    assert err.count(PLAN_LINE) == 1 and err.count("[rpg] dry run: a local launch would refuse: ") == 3
    with pytest.raises(RecipeConfigError, match="this node cannot run the config") as e:
        gpu.check_gpu_launch(dapo_7b, dry_run=False, local=True)
    assert "vllm" in str(e.value) and "flash-attn" in str(e.value) and "N_GPUS=2" in str(e.value)
    gpu.check_gpu_launch(dapo_7b, dry_run=False, local=False)  # a Ray job: the cluster's nodes are not this one


# ---- 5. Several nodes: CKPTS_DIR shared (rpg/preflight/shared_ckpt.py; its check: tests/e2e/test_shared_ckpt_dir) --
def test_several_nodes_that_save_check_the_checkpoint_folder(rpg_4b, monkeypatch):
    """The periodic reference's old declaration (RPG_SHARED_CKPT) is gone: every multi-node run that saves or resumes
    from a path is checked at launch (the sentinel check), whatever the reference mode."""
    from rpg.launch import validate_rpg
    from rpg.preflight.shared_ckpt import needs_check

    periodic = cfg_with(rpg_4b, **PERIODIC, actor_rollout_ref__actor__policy_loss__ref_refresh_steps=64)
    assert not needs_check(periodic)  # one node
    two_nodes = cfg_with(periodic, trainer__nnodes=2)
    as_launched(validate_rpg, two_nodes)  # no rule of its own any more
    assert needs_check(two_nodes) and needs_check(cfg_with(rpg_4b, trainer__nnodes=2))
    assert not needs_check(cfg_with(two_nodes, trainer__save_freq=-1))  # nothing saved
    assert needs_check(cfg_with(two_nodes, trainer__save_freq=-1, trainer__resume_mode="resume_path"))
