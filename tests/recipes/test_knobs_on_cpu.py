"""The recipe knobs are one list (rpg/preflight/recipe_argv.py, KNOBS and REFUSED): the documentation's table, the
exported-knob rule and the Hydra quoting of the command all come from it; common.sh holds none."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from recipe_helpers import RECIPE, REPO, run_script

from rpg.preflight import recipe_argv as ra

README = RECIPE / "README.md"


def test_readme_knob_table_is_generated_from_the_knob_list():
    text = README.read_text()
    found = re.search(r"<!-- knobs[^>]*-->\n(.*?)<!-- /knobs -->", text, re.S)
    assert found, "recipe/rpg/README.md has no <!-- knobs --> block"
    assert found.group(1) == ra.markdown(), (
        "recipe/rpg/README.md's knob table differs from rpg/preflight/recipe_argv.py KNOBS/REFUSED: regenerate it "
        "with python -m rpg.preflight.recipe_argv --markdown"
    )


def test_common_sh_only_chooses_the_interpreter_and_execs():
    """common.sh holds no knob, no eval, no default: one exec of the launcher (rpg/preflight/recipe_argv.py)."""
    text = (RECIPE / "common.sh").read_text()
    code = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "eval" not in text and len(code) <= 3, code
    assert any(line.startswith("exec ") for line in code)
    for name in (*ra.KNOB_NAMES, *ra.REFUSED):
        assert not re.search(rf"\b{name}\b", "\n".join(code)), f"common.sh reads {name}"
    assert not (RECIPE / "cpu" / "profile.sh").exists() and not (RECIPE / "optim").exists()


@pytest.mark.parametrize("name, value, key", [("LR", "9e-9", "actor_rollout_ref.actor.optim.lr"),
                                              ("KL_COEF", "1e-3", "actor_rollout_ref.actor.policy_loss.kl_coef")])
def test_an_exported_recipe_setting_is_refused_with_its_override(name, value, key):
    """The exported-knob rule: a former script setting in the environment is refused before launch (a script's name
    means its config), naming the knob and the Hydra override to pass instead; nothing is launched or printed."""
    proc = run_script(RECIPE / "4b" / "run_rpg_reinforce_urkl_4k.sh", RPG_PRINT_ARGV="1", **{name: value})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert f"{name} exported" in proc.stderr and f"{key}={value}" in proc.stderr, proc.stderr
    assert f"Unset {name}" in proc.stderr


def test_the_override_an_exported_setting_names_is_honoured():
    """... and the override it names does what the knob did."""
    script = RECIPE / "4b" / "run_rpg_reinforce_urkl_4k.sh"
    proc = run_script(script, "actor_rollout_ref.actor.optim.lr=9e-9", RPG_PRINT_ARGV="1")
    assert proc.returncode == 0, proc.stderr
    from rpg.launch import compose_config

    cfg = compose_config(json.loads(proc.stdout)["argv"][3:])
    assert cfg.actor_rollout_ref.actor.optim.lr == 9e-9 and cfg.actor_rollout_ref.actor.policy_loss.kl_coef == 1e-4


def test_environment_knobs_are_honoured():
    """Paths, names and cluster size are environment knobs: exported, they reach the config."""
    script = RECIPE / "7b" / "run_dapo_7b.sh"
    proc = run_script(script, RPG_PRINT_ARGV="1", MODEL_PATH="/m/x", N_GPUS="4", NNODES="2", PROJECT_NAME="p",
                      EXP_NAME="e", DATA_DIR="/d")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from rpg.launch import compose_config

    cfg = compose_config(json.loads(proc.stdout)["argv"][3:])
    assert cfg.actor_rollout_ref.model.path == "/m/x"  # wins over the setup's model
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes, cfg.trainer.default_local_dir) == (4, 2, f"{REPO}/ckpts/p/e")
    assert list(cfg.data.val_files) == ["/d/amc-2023.parquet", "/d/aime-2024.parquet", "/d/aime-2025.parquet"]


def test_a_mode_knob_is_honoured_where_the_mode_is_selected_and_refused_elsewhere():
    """REF_EMA_DECAY reaches an EMA script's config; exported for a script without that mode it is refused (a knob
    is never silently dropped), naming the mode and how to select it."""
    proc = run_script(RECIPE / "4b" / "run_rpg_reinforce_urkl_4k_ema.sh", RPG_PRINT_ARGV="1", REF_EMA_DECAY="0.5")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["argv"][-1] == "actor_rollout_ref.actor.policy_loss.ref_ema_decay=0.5"
    proc = run_script(RECIPE / "4b" / "run_rpg_reinforce_urkl_4k.sh", RPG_PRINT_ARGV="1", REF_EMA_DECAY="0.5")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert "REF_EMA_DECAY=0.5 is exported, but it is a knob of the reference=ema mode" in proc.stderr, proc.stderr
    assert ("add actor_rollout_ref.actor.policy_loss.reference=ema actor_rollout_ref.actor.use_kl_loss=True "
            "actor_rollout_ref.actor.kl_loss_coef=0 after the script name") in proc.stderr  # the whole fix at once
    fix = proc.stderr.split("select the mode: add ")[1].split(" after the script name")[0].split()
    proc = run_script(RECIPE / "4b" / "run_rpg_reinforce_urkl_4k.sh", *fix, RPG_PRINT_ARGV="1", REF_EMA_DECAY="0.5")
    assert proc.returncode == 0, proc.stderr
    from rpg.launch import compose_and_validate

    policy_loss = compose_and_validate(json.loads(proc.stdout)["argv"][3:]).config.actor_rollout_ref.actor.policy_loss
    assert (policy_loss.reference, policy_loss.ref_ema_decay) == ("ema", 0.5)  # the second attempt is valid


@pytest.mark.parametrize("path", ["/d/a b.parquet", "/d/it's.parquet", "/d/x\\'y", "/d/${oc.env:HOME}", "/d/a\\\\",
                                  "/d/\\${x}", "C:\\data\\"])  # fmt: skip
def test_hydra_str_composes_to_the_exact_string(path: str):
    from rpg.launch import compose_config

    cfg = compose_config([f"trainer.default_local_dir={ra.hydra_str(path)}"])
    assert cfg.trainer.default_local_dir == path


def test_hydra_files_splits_lines_and_keeps_lists():
    assert ra.hydra_files("/a b.parquet\n\n/c.parquet") == "['/a b.parquet','/c.parquet']"
    assert ra.hydra_files("['/x.parquet']") == "['/x.parquet']"


def test_stdlib_only():
    """common.sh runs `python -m rpg.preflight.recipe_argv` with any python3: the module and the rpg modules it
    imports need nothing outside the standard library (an interpreter without site-packages imports it)."""
    import sys

    imports = "import rpg.preflight.recipe_argv; print(json.dumps([*sys.modules]))"
    code = f"import json, sys; sys.path.insert(0, sys.argv[1]); {imports}"
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rpg_modules = sorted(m for m in json.loads(proc.stdout) if m.split(".")[0] == "rpg")
    assert rpg_modules == ["rpg", "rpg.modes", "rpg.preflight", "rpg.preflight.ray_submit", "rpg.preflight.recipe_argv"]


# ----------------------------------------------------------------------------------------------------------------------
# OLD_LOGPROB and TRAINER_MODE (docs/async.md#knobs): environment knobs, passed only when not the default
# ----------------------------------------------------------------------------------------------------------------------
BYPASS = "algorithm.rollout_correction.bypass_mode=True"


def _probe(tmp_path, choices: str):
    """A throwaway recipe script (recipe/rpg/<dir>/ layout) that sources the real common.sh with `choices`."""
    script = tmp_path / "probe" / "run_probe.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f'source "{RECIPE}/common.sh" {choices} "$@"\n')
    return script


@pytest.mark.parametrize(
    "env, present, absent",
    [
        ({}, [], [BYPASS, "trainer.v1.trainer_mode="]),
        ({"OLD_LOGPROB": "recompute", "TRAINER_MODE": "sync"}, [], [BYPASS, "trainer.v1.trainer_mode="]),
        ({"OLD_LOGPROB": "rollout"}, [BYPASS], ["trainer.v1.trainer_mode="]),
        ({"TRAINER_MODE": "colocate_async"}, ["trainer.v1.trainer_mode=colocate_async"], [BYPASS]),
        ({"TRAINER_MODE": "separate_async"}, ["trainer.v1.trainer_mode=separate_async"], [BYPASS]),
    ],
    ids=["defaults", "explicit-defaults", "rollout", "colocate_async", "separate_async"],
)
def test_async_knobs_map_to_verl_settings(tmp_path, env, present, absent):
    script = _probe(tmp_path, "method=rpg_reinforce recipe.divergence=urkl recipe.beta=1e-4")
    for profile in ("gpu", "cpu"):
        proc = run_script(script, RPG_PRINT_ARGV="1", RPG_PROFILE=profile, **env)
        assert proc.returncode == 0, proc.stderr
        argv = json.loads(proc.stdout)["argv"]
        for needle in present:
            assert needle in argv, (profile, argv)
        for needle in absent:
            assert not any(a.startswith(needle) for a in argv), (profile, needle)


@pytest.mark.parametrize(
    "name, value, choices",
    [("OLD_LOGPROB", "actor", "recompute rollout"), ("TRAINER_MODE", "async", "sync colocate_async separate_async")],
)
def test_a_bad_async_knob_is_refused(tmp_path, name, value, choices):
    script = _probe(tmp_path, "")
    proc = run_script(script, RPG_PRINT_ARGV="1", **{name: value})
    assert proc.returncode == 2, proc.stdout
    assert f"{name}='{value}' is not valid; choose one of: {choices}" in proc.stderr, proc.stderr


def test_schedule_free_with_an_async_trainer_mode_is_refused(tmp_path):
    script = _probe(tmp_path, "method=dapo")
    proc = run_script(script, RPG_PRINT_ARGV="1", OPTIM="schedulefree", TRAINER_MODE="colocate_async")
    assert proc.returncode == 2, proc.stdout
    assert "TRAINER_MODE='colocate_async' with OPTIM=schedulefree" in proc.stderr, proc.stderr
    assert "no asynchronous" in proc.stderr, proc.stderr


def test_help_states_the_exported_knob_rule():
    proc = run_script(RECIPE / "4b" / "run_dapo_4k.sh", "--help", LR="1e-9")  # --help runs nothing, refuses nothing
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: bash run_dapo_4k.sh") and "Exported-knob rule" in proc.stdout
    assert "LR                     -> actor_rollout_ref.actor.optim.lr" in proc.stdout and "MODEL_PATH" in proc.stdout
