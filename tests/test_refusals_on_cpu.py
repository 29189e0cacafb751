"""The launcher's refusals are messages (rpg/preflight/refusal.py; docs/launcher.md#refusals): the project's own
refusal exits 1 with one `[rpg] error:` paragraph; HYDRA_FULL_ERROR=1 gives the traceback; any other error keeps it.
A dry run refused by a rule, through Hydra, is checked end to end by tests/test_docs_commands_on_cpu.py."""

from __future__ import annotations

import pytest

from rpg.preflight import refusal
from rpg.preflight.compose import RecipeConfigError


def refuse():
    with refusal.as_message():
        raise RecipeConfigError("invalid RPG configuration:\n- x=1 is wrong; set x=2")


def test_a_refusal_is_one_paragraph_and_status_1(monkeypatch):
    monkeypatch.delenv(refusal.FULL_ERROR_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_:
        refuse()
    assert exit_.value.code == "[rpg] error: invalid RPG configuration:\n  - x=1 is wrong; set x=2"
    assert exit_.value.__cause__ is None and exit_.value.__suppress_context__


def test_hydra_full_error_shows_the_traceback(monkeypatch):
    monkeypatch.setenv(refusal.FULL_ERROR_ENV, "1")
    with pytest.raises(RecipeConfigError, match="set x=2"):
        refuse()


def test_an_unexpected_error_keeps_its_traceback(monkeypatch):
    monkeypatch.delenv(refusal.FULL_ERROR_ENV, raising=False)
    with pytest.raises(KeyError, match="surprise"):
        with refusal.as_message():
            raise KeyError("surprise")


def test_a_summary_only_dry_run_prints_the_summary_with_every_refusal(monkeypatch, capsys):
    """RPG_DRY_RUN=summary: no YAML, the summary alone on stdout, the free-disk refusal in its list (docs/launcher.md)."""
    from rpg import launch
    from rpg.preflight.summary import HEADER

    cfg = launch.compose_config(["setup=qwen3_4b_4k", "method=rpg_reinforce", "recipe.divergence=urkl",
                                 "recipe.beta=1e-4", "trainer.n_gpus_per_node=8"])  # fmt: skip
    monkeypatch.setenv(launch.DRY_RUN_ENV, launch.SUMMARY_ONLY)
    monkeypatch.setattr(launch, "disk_problem", lambda config: "the checkpoint folder has 1.0 GB free (DISK)")
    launch.run(cfg)
    out = capsys.readouterr().out
    assert out.startswith(HEADER) and "actor_rollout_ref:" not in out, out[:300]
    assert "#   - the checkpoint folder has 1.0 GB free (DISK)" in out.splitlines()


def test_an_rpg_option_refused_by_its_config_class_is_a_message(monkeypatch):
    """`kl_control=adaptive` without `kl_target`: RPGPolicyLossConfig's own ValueError (raised inside Hydra's
    instantiate) is a project refusal: one `[rpg] error:` paragraph naming the full keys, not Hydra's "Error in call
    to target" (issue: refusals that look like crashes)."""
    from rpg import launch

    monkeypatch.delenv(refusal.FULL_ERROR_ENV, raising=False)
    monkeypatch.setenv(launch.DRY_RUN_ENV, launch.SUMMARY_ONLY)
    cfg = launch.compose_config(["setup=qwen3_4b_4k", "method=rpg_reinforce", "recipe.divergence=urkl",
                                 "recipe.beta=1e-4", "+actor_rollout_ref.actor.policy_loss.kl_control=adaptive"])
    with pytest.raises(SystemExit) as exit_:
        with refusal.as_message():
            launch.run(cfg)
    text = str(exit_.value.code)
    assert text.startswith("[rpg] error: actor_rollout_ref.actor.policy_loss:"), text
    assert "actor_rollout_ref.actor.policy_loss.kl_target=<KL per token, e.g. 1e-3>" in text, text
    assert "Error in call to target" not in text, text
