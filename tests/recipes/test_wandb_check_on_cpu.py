"""wandb checked before Ray starts (rpg/preflight/wandb_check.py; docs/gpu.md#wandb): a run that logs to wandb needs
credentials or an offline mode, read from the launcher's environment and the Ray runtime environment's env_vars;
~/.netrc counts for a local launch only. One CPU recipe is refused in-process before verl's run_ppo."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf
from recipe_helpers import SCRIPTS_CPU, cfg_with, composed

from rpg.launch import RecipeConfigError
from rpg.preflight.wandb_check import FIXES, wandb_problem

NO_NETRC = "/nonexistent/netrc"


def _cfg(logger=("console", "wandb"), env_vars=None):
    ray = {"ray_init": {"runtime_env": {"env_vars": env_vars}}} if env_vars is not None else {}
    return OmegaConf.create({"trainer": {"logger": list(logger)}, "ray_kwargs": ray})


def test_no_credentials_is_refused_naming_the_three_fixes():
    problem = wandb_problem(_cfg(), environ={}, local=True, netrc_path=NO_NETRC)
    assert problem.startswith("trainer.logger includes wandb, but wandb has no credentials and no offline mode")
    for fix in ("wandb login", "export WANDB_API_KEY=", "export WANDB_MODE=offline"):
        assert fix in problem
    assert all(fix in problem for fix in FIXES)


@pytest.mark.parametrize("environ, env_vars", [
    ({"WANDB_MODE": "offline"}, None), ({"WANDB_MODE": "disabled"}, None), ({"WANDB_API_KEY": "k"}, None),
    ({}, {"WANDB_API_KEY": "k"}), ({}, {"WANDB_MODE": "offline"}),  # the Ray runtime environment's variables count
])  # fmt: skip
def test_credentials_or_an_offline_mode_pass(environ, env_vars):
    assert wandb_problem(_cfg(env_vars=env_vars), environ=environ, local=True, netrc_path=NO_NETRC) is None


def test_no_wandb_logger_is_not_checked():
    assert wandb_problem(_cfg(logger=("console", "file")), environ={}, local=True, netrc_path=NO_NETRC) is None
    assert wandb_problem(_cfg(logger=("tracking",)), environ={}, local=True, netrc_path=NO_NETRC)  # verl: = wandb


def test_the_runtime_environment_wins_over_the_launchers():
    cfg = _cfg(env_vars={"WANDB_MODE": "online"})
    assert wandb_problem(cfg, environ={"WANDB_MODE": "offline"}, local=True, netrc_path=NO_NETRC)


def test_netrc_counts_only_for_a_local_launch(tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    netrc.chmod(0o600)
    assert wandb_problem(_cfg(), environ={}, local=True, netrc_path=str(netrc)) is None
    job = wandb_problem(_cfg(), environ={"RAY_ADDRESS": "http://head:8265"}, netrc_path=str(netrc))
    assert job and "a Ray job at RAY_ADDRESS: ~/.netrc on this machine does not count" in job
    other_host = {"WANDB_BASE_URL": "https://wandb.example.org"}  # a self-hosted server: its own netrc entry
    assert wandb_problem(_cfg(), environ=other_host, local=True, netrc_path=str(netrc))


def test_a_cpu_recipe_logging_to_wandb_is_refused_before_ray(monkeypatch, capsys, tmp_path):
    """`run` (what `python -m rpg.launch` calls): a real launch raises before verl's run_ppo; a dry run reports it."""
    import verl.trainer.main_ppo as main_ppo
    import verl.utils.device

    from rpg.launch import run

    def must_not_start(*args, **kwargs):
        raise AssertionError("Ray and the trainer were started")

    monkeypatch.setattr(main_ppo, "run_ppo", must_not_start)
    # trainer.device stays cpu, as the CPU profile's platform (VERL_PLATFORM=cpu, set by the recipe) keeps it
    monkeypatch.setattr(verl.utils.device, "auto_set_device", lambda config: None)
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "RAY_ADDRESS", "RPG_DRY_RUN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    cfg = cfg_with(composed(SCRIPTS_CPU[0]), trainer__logger=["console", "wandb"])
    with pytest.raises(RecipeConfigError, match="wandb has no credentials and no offline mode") as e:
        run(copy.deepcopy(cfg))
    assert all(fix in str(e.value) for fix in ("wandb login", "WANDB_API_KEY", "WANDB_MODE=offline"))
    monkeypatch.setenv("RPG_DRY_RUN", "1")
    run(copy.deepcopy(cfg))
    out, err = capsys.readouterr()
    assert "[rpg] dry run: a real launch would refuse: trainer.logger includes wandb" in err
    assert "#   - trainer.logger includes wandb" in out  # the summary's refusals
