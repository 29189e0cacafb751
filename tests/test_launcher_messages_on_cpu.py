"""What a person meets first: the launcher's early refusals (before verl is imported), its --help page, the dry run's
summary, the prompt-length check, a GPU recipe's dry run under an interpreter without verl, and scripts/setup_env.sh
refusing a GPU environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpg.preflight import early

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipe" / "rpg"
LOSS = early.LOSS_MODE_KEY


# ---- verl's own names ------------------------------------------------------------------------------------------------
def test_the_static_names_are_verls_and_rpgs():
    """The early check's lists equal verl 0.9.1's registries and PolicyLossConfig, and RPG's own additions."""
    import dataclasses

    import rpg.verl_plugin as plugin
    from rpg.advantages import ADVANTAGE_ESTIMATORS
    from rpg.loss_config import RPGPolicyLossConfig
    from rpg.loss_options import option_names
    from rpg.loss_table import LOSSES
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    from verl.workers.config import PolicyLossConfig

    def verls(registry, *packages):  # verl's (and `packages`') entries: other tests of this worker may add spies
        prefixes = tuple(f"{p}." for p in ("verl", *packages))
        return sorted(n for n, f in registry.items() if getattr(f, "__module__", "").startswith(prefixes))

    assert sorted(early.VERL_POLICY_LOSSES) == verls(POLICY_LOSS_REGISTRY)
    assert sorted(early.VERL_ADV_ESTIMATORS) == verls(ADV_ESTIMATOR_REGISTRY)
    assert early.rpg_adv_estimators() == tuple(ADVANTAGE_ESTIMATORS)
    assert sorted(early.rpg_adv_estimators()) == sorted(set(verls(ADV_ESTIMATOR_REGISTRY, "rpg")) - set(
        early.VERL_ADV_ESTIMATORS))
    assert sorted(early.policy_loss_names()) == verls(POLICY_LOSS_REGISTRY, "rpg")
    assert set(LOSSES) <= set(plugin.REGISTERED)
    verl_fields = [f.name for f in dataclasses.fields(PolicyLossConfig)]
    assert list(early.VERL_POLICY_LOSS_FIELDS) == verl_fields
    assert [f.name for f in dataclasses.fields(RPGPolicyLossConfig) if f.name not in verl_fields] == list(
        option_names()
    )


# ---- refused before verl is imported ---------------------------------------------------------------------------------
PROBE = """
import json, sys
import rpg.launch
try:
    rpg.launch.main(sys.argv[1:])
except SystemExit as e:
    print(json.dumps({"message": str(e), "verl": "verl" in sys.modules}))
"""


def test_misspelt_names_are_refused_before_verl_is_imported():
    """`python -m rpg.launch ...loss_mode=rpg_nope` (as every recipe runs it): refused with the closest names and
    --list, one line per mistake, before verl is imported."""
    args = [f"{LOSS}=rpg_nope", f"+{early.POLICY_LOSS_KEY}.kl_coeff=1e-3", "algorithm.adv_estimator=rpg_mean"]
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["verl"] is False
    lines = got["message"].splitlines()
    assert lines[0] == (
        f"[rpg] error: {LOSS}='rpg_nope' is not a policy loss; did you mean 'rpg_rkl' or 'rpg_fkl' or 'rpg_urkl'? "
        "All names: python -m rpg.launch --list"
    )
    assert lines[1].startswith("[rpg] error: actor_rollout_ref.actor.policy_loss.kl_coeff: 'kl_coeff' is not an option")
    assert "did you mean 'kl_coef'" in lines[1] and "--list" in lines[1]
    assert lines[2].startswith("[rpg] error: algorithm.adv_estimator='rpg_mean' is not an advantage estimator; did "
                               "you mean 'rpg_batchmean' or 'rpg'") and "--list" in lines[2]  # fmt: skip


def test_valid_names_pass_the_early_check():
    assert early.check_overrides([
        f"{LOSS}=rpg_reinforce_urkl", f"{LOSS}=vanilla", "algorithm.adv_estimator=grpo", "algorithm.adv_estimator=rpg",
        "++actor_rollout_ref.actor.policy_loss.kl_coef=1e-3", "actor_rollout_ref.actor.policy_loss.reference=frozen",
        "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is=token", f"{LOSS}=${{oc.env:LOSS}}",
        "~actor_rollout_ref.actor.policy_loss.nope",
    ]) == []  # fmt: skip


def test_engine_warnings_are_filtered_in_the_launch_processes():
    """The PYTHONWARNINGS a launch exports silences verl's five optional-engine warnings in a fresh process (a Ray
    worker), and keeps a user's own filters."""
    from rpg.launch import quiet_engine_warnings

    environ = {"PYTHONWARNINGS": "ignore::DeprecationWarning"}
    quiet_engine_warnings(environ)
    quiet_engine_warnings(environ)  # idempotent
    assert environ["PYTHONWARNINGS"].startswith("ignore::DeprecationWarning,") and environ["PYTHONWARNINGS"].count(
        "engine is not available") == 5
    import importlib.util

    from rpg.launch import OPTIONAL_ENGINES

    source = Path(importlib.util.find_spec("verl.workers.engine").origin).read_text()
    assert source.count("engine is not available: {e!r}") == len(OPTIONAL_ENGINES)  # verl warns for these, and only
    assert all(f'warnings.warn(f"{name} engine is not available' in source for name in OPTIONAL_ENGINES)
    code = "import verl.workers.engine"  # here torchtitan, megatron, ... are not installed: all five would warn
    # the child gets a launch's environment: not the CPU platform's variables an in-process test of this worker set
    env = {k: v for k, v in {**os.environ, **environ}.items() if k not in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert quiet.returncode == 0 and "engine is not available" not in quiet.stderr, quiet.stderr


def test_help_is_a_page_about_the_launcher(capsys):
    from rpg.launch import main

    main(["--help"])
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 60
    words = ("RPG_DRY_RUN=1", "SMOKE=1", "RPG_PRINT_ARGV=1", "--list", "--help-config", "kl_coef", "after the script")
    assert [w for w in words if w not in text] == []


def test_a_gpu_recipe_dry_run_without_verl_says_what_to_do(tmp_path):
    """`RPG_DRY_RUN=1 bash recipe/rpg/4b/...` where python3 has no verl (here: this Python without site-packages)."""
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "RAY_ADDRESS", "RPG_PRINT_ARGV", "SMOKE")}
    env.update(RPG_DRY_RUN="1", PATH=f"{tmp_path}:{env['PATH']}")
    proc = subprocess.run(["bash", str(RECIPE / "4b" / "run_rpg_reinforce_urkl_4k.sh")], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert proc.returncode != 0 and "ModuleNotFoundError" not in proc.stderr, proc.stderr
    assert "cannot import verl" in proc.stderr and "docs/gpu.md" in proc.stderr
    assert "PYTHON=.venv/bin/python RPG_DRY_RUN=1" in proc.stderr


# ---- the dry run's summary -------------------------------------------------------------------------------------------
def test_a_dry_run_ends_with_its_summary(monkeypatch, capsys, tmp_path):
    """`RPG_DRY_RUN=1 bash <7b script>` in-process through `rpg.launch.main`: the YAML, then the summary as its last
    lines (YAML comments: the output is still one YAML document); verl's engine warnings are not shown."""
    import warnings

    import yaml

    from rpg import launch
    from rpg.preflight.summary import HEADER
    from rpg.tools.dry_run_digest import script_overrides

    monkeypatch.setattr(sys, "argv", ["rpg.launch"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RPG_DRY_RUN", "1")
    monkeypatch.setenv("GPU_MEMORY_GIB", "80")
    for name in ("RAY_ADDRESS", "SMOKE"):
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings():
        launch.main(script_overrides(RECIPE / "7b" / "run_rpg_7b_urkl1e-4.sh"))
    out, err = capsys.readouterr()
    lines = out.splitlines()
    start = lines.index(HEADER)
    summary = lines[start:]
    assert yaml.safe_load(out)["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == "rpg_urkl"
    assert summary[1:8] == [
        "# model      Qwen/Qwen2.5-Math-7B",
        "# loss       rpg_urkl (RPG-URKL), advantage rpg",
        "# beta       β = 0.0001 (policy_loss.kl_coef)",
        "# reference  iterative (π_ref = π_old, no reference model)",
        "# clip       ε1 0.2, ε2 0.28, dual-clip c 10",
        summary[6],  # the context, below
        "# batch      512 prompts × 16 responses, mini-batch 32, lr 1e-06",
    ]
    # the prompt lengths are checked where the tokenizer was downloaded (not here, unless in the Hugging Face cache)
    assert summary[6].startswith("# context    prompt 2048 + response 2048 tokens (truncation left; prompt lengths ")
    assert summary[8].startswith("# steps      400 steps") and summary[10].startswith("# memory     rollout ")
    assert summary[11] == "# a launch would refuse:" and all(line.startswith("#   - ") for line in summary[12:])
    assert any("data.train_files" in line for line in summary[12:])  # no data here: a launch would refuse it
    assert "engine is not available" not in err


# ---- prompts longer than the configured length -----------------------------------------------------------------------
LONG_SYSTEM = "You are a helpful AI assistant named Tiny, trained to answer math questions."
LONG_TEMPLATE = (
    "{{ '<|im_start|>system\n" + LONG_SYSTEM + "<|im_end|>\n' }}{% for message in messages %}{{ '<|im_start|>' + "
    "message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_prompts_longer_than_the_configured_length_are_refused(tiny_tokenizer, tmp_path, monkeypatch):
    """A tokenizer whose template adds a system prompt (as SmolLM2's does) makes 12-byte questions longer than 48
    tokens: refused, naming both lengths and the setting; verl's own filter (`filter_overlong_prompts`) drops
    exactly the prompts counted."""
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from rpg.preflight.prompts import prompt_length_problems

    from transformers import AutoTokenizer

    model = tmp_path / "model"
    tiny_tokenizer.save_pretrained(model)
    tokenizer = AutoTokenizer.from_pretrained(model)  # a copy: the session's tiny_tokenizer keeps its template
    tokenizer.chat_template = LONG_TEMPLATE
    tokenizer.save_pretrained(model)
    data = tmp_path / "train.parquet"
    questions = ["What is 1+1?", "What is 12+13? Think step by step and answer."]
    prompts = [[{"role": "user", "content": q}] for q in questions]
    pd.DataFrame({"data_source": "math_dapo", "prompt": prompts}).to_parquet(data)
    # one token per byte, one per special token (5 of them): the longest question's rendered prompt
    longest = 5 + len(f"system\n{LONG_SYSTEM}\nuser\n{questions[1]}\nassistant\n".encode())
    config = OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": str(model)}},
        "data": {"train_files": [str(data)], "val_files": [], "max_prompt_length": 48, "prompt_key": "prompt",
                 "truncation": "left", "filter_overlong_prompts": False, "apply_chat_template_kwargs": {}},
    })  # fmt: skip
    [problem] = prompt_length_problems(config)
    assert "2 of 2 prompts are longer than data.max_prompt_length=48 " in problem
    assert f"(the longest: {longest} tokens); with data.truncation=left they would be cut silently" in problem
    assert f"Fix: data.max_prompt_length={longest} or more, or data.filter_overlong_prompts=True" in problem

    config.data.max_prompt_length = longest - 1  # only the long question is over
    assert "1 of 2 prompts" in prompt_length_problems(config)[0]
    verl_config = OmegaConf.create({**OmegaConf.to_container(config.data), "filter_overlong_prompts": True})
    monkeypatch.setattr(os, "environ", os.environ)  # `datasets` (its num_proc filter) replaces os.environ: put it back
    assert len(RLHFDataset([str(data)], tokenizer, verl_config)) == 1  # verl drops the one counted
    config.data.filter_overlong_prompts = True  # verl drops them: allowed
    assert prompt_length_problems(config) == []
    config.data.filter_overlong_prompts, config.data.max_prompt_length = False, longest
    assert prompt_length_problems(config) == []


def test_the_launcher_refuses_overlong_prompts_before_launch(tiny_dir):
    """The CPU profile, the tiny model (prompts of 33-35 tokens), a 30-token prompt length: validate() refuses."""
    from rpg.launch import RecipeConfigError, compose_and_validate
    from rpg.tools.dry_run_digest import script_overrides

    overrides = script_overrides(RECIPE / "cpu" / "run_rpg_reinforce_urkl.sh") + ["data.max_prompt_length=30"]
    with pytest.raises(RecipeConfigError, match=r"2000 of 2000 prompts are longer than data.max_prompt_length=30 .*"
                                                r"\(the longest: 35 tokens\)"):  # fmt: skip
        compose_and_validate(overrides)


# ---- scripts/setup_env.sh never installs into a GPU environment -----------------------------------------------------
def test_setup_env_refuses_a_venv_with_a_cuda_torch(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\necho 12.8\n")  # what `import torch; print(torch.version.cuda)` prints in a GPU env
    python.chmod(0o755)
    env = {**os.environ, "RPG_VENV": str(venv)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh")], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 2
    assert f"{venv} holds a CUDA torch (CUDA 12.8)" in proc.stderr and ".venv-gpu" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["venv"]  # nothing installed, no lock file
