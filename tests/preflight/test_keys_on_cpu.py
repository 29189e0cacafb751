""""Did you mean" for every key (rpg/preflight/keys.py; docs/launcher.md#did-you-mean): the key index equals what Hydra
composes, every recipe script's command line passes, and a misspelt key, `+key`, group choice or choice value is
refused with the closest names, before verl is imported."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from rpg.preflight import keys, recipe_argv

REPO = keys.CONFIG_DIR.parents[1]
RECIPE_ARGS = "setup=qwen3_4b_4k method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4".split()
KNOBS = {"MODEL_PATH": "/m", "TRAIN_FILE": "/d/t.parquet", "TEST_FILE": "/d/v.parquet", "CKPTS_DIR": "/c",
         "N_GPUS": "8", "NNODES": "2", "PROJECT_NAME": "p", "EXP_NAME": "e", "RPG_DRY_RUN": "1"}  # fmt: skip


def test_the_index_is_what_hydra_composes():
    built = keys.build_index()
    stored = keys.load_index()
    assert built == stored, "rpg/preflight/key_index.json is stale: python -m rpg.preflight.keys --write"
    assert "actor_rollout_ref.actor.optim.lr" in stored["keys"] and "recipe.divergence" in stored["keys"]
    assert "lr" in stored["fields"]["actor_rollout_ref.actor.optim"][1]


def script_args(script):
    line = next(ln for ln in script.read_text().splitlines() if ln.startswith("source "))
    return [a for a in shlex.split(line)[2:] if a != "$@"]


@pytest.mark.parametrize("env", [KNOBS, {**KNOBS, "RPG_PROFILE": "cpu", "OPTIM": "schedulefree"}], ids=["gpu", "cpu"])
def test_every_recipe_scripts_command_line_passes(env):
    scripts = sorted((REPO / "recipe" / "rpg").glob("*/run_*.sh"))
    assert len(scripts) > 90
    for script in scripts:
        spec = recipe_argv.parse(["--repo", str(REPO), "--script", script.stem, "--", *script_args(script)])
        argv, _, _ = recipe_argv.command(spec, dict(env))
        assert keys.key_problems(argv[3:]) == [], script


CASES = [
    ("actor_rollout_ref.actor.optim.lrr=1e-6", ["actor_rollout_ref.actor.optim.lr?", "`+` in front"]),
    ("+actor_rollout_ref.actor.optim.lrr=1e-6", ["FSDPOptimizerConfig", "has no field 'lrr'", "optim.lr?"]),
    ("actor_rollout_ref.actor.clip_ratio_hgh=0.3", ["did you mean actor_rollout_ref.actor.clip_ratio_high"]),
    ("trainer.total_epoch=3", ["no such key", "did you mean trainer.total_epochs"]),
    ("setup=qwen3_4b_4kk", ["did you mean qwen3_4b_4k", "valid: authors_7b_instruct"]),
    ("method=rpg_reinforc", ["did you mean rpg_reinforce", "valid: dapo"]),
    ("actor_rollout_ref.actor.loss_agg_mode=token-meen", ["did you mean token-mean", "valid: token-mean, token-sum"]),
    ("actor_rollout_ref.actor.policy_loss.reference=emaa", ["did you mean ema", "valid: iterative, frozen"]),
    ("+actor_rollout_ref.actor.policy_loss.kl_credit=seq", ["valid: token, sequence"]),
    ("trainer.v1.trainer_mode=colocate_asink", ["did you mean colocate_async", "valid: sync, colocate_async"]),
]


@pytest.mark.parametrize("override,said", CASES, ids=[c[0] for c in CASES])
def test_a_misspelt_key_group_or_value_is_named(override, said):
    (problem,) = keys.key_problems([*RECIPE_ARGS, override])
    assert all(s in problem for s in said), problem


def test_valid_additions_and_free_keys_pass():
    ok = ["+actor_rollout_ref.model.override_config.attention_dropout=0.0", "++trainer.total_epochs=2",
          "+actor_rollout_ref.actor.policy_loss.kl_coef=1e-3", "~trainer.logger", "hydra.run.dir=.", "setup=null",
          "+ray_kwargs.ray_init.num_cpus=4"]  # fmt: skip
    assert keys.key_problems([*RECIPE_ARGS, *ok]) == []


def test_the_launcher_refuses_before_importing_verl():
    code = ("import sys\nfrom rpg import launch\ntry:\n    launch.main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print(e)\nprint('verl imported:', 'verl' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, *RECIPE_ARGS, "actor_rollout_ref.actor.optim.lrr=1e-6"],
                         capture_output=True, text=True, timeout=120, cwd=REPO).stdout  # fmt: skip
    assert "[rpg] error: actor_rollout_ref.actor.optim.lrr=1e-6" in out and "verl imported: False" in out, out
