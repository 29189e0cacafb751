"""The recipe knobs are one list (rpg/preflight/recipe_argv.py, KNOBS): common.sh's defaults, the documentation's table
and the Hydra quoting of the command all come from it."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from recipe_helpers import RECIPE, run_script

from rpg.preflight import recipe_argv as ra

README = RECIPE / "README.md"


def test_readme_knob_table_is_generated_from_the_knob_list():
    text = README.read_text()
    found = re.search(r"<!-- knobs[^>]*-->\n(.*?)<!-- /knobs -->", text, re.S)
    assert found, "recipe/rpg/README.md has no <!-- knobs --> block"
    assert found.group(1) == ra.markdown(), (
        "recipe/rpg/README.md's knob table differs from rpg/preflight/recipe_argv.py KNOBS: regenerate it with "
        "python rpg/preflight/recipe_argv.py --markdown"
    )


def test_common_sh_names_every_script_knob_and_sets_no_default_itself():
    text = (RECIPE / "common.sh").read_text()
    header = text[text.index("# What an experiment script may set") : text.index("_rpg_defaults=")]
    listed = set(re.findall(r"\b[A-Z][A-Z_]+\b", header.split(":")[0] + header.split("(")[1].split(")")[0]))
    assert listed == {k.name for k in ra.KNOBS if k.script}
    for knob in ra.KNOBS:
        if knob.script:  # the default lives in Python only
            assert not re.search(rf"^{knob.name}=", text, re.M), f"common.sh sets {knob.name} at the top level"


def test_script_knobs_are_reset_from_the_environment(tmp_path):
    """An exported LR never reaches a script that does not set it (common.sh resets the script knobs)."""
    script = tmp_path / "run_probe.sh"
    script.write_text(f'source "{RECIPE}/common.sh"\npreset_dapo\nrpg_run "$@"\n')
    proc = run_script(script, RPG_PRINT_ARGV="1", LR="9e-9", CTX="8")
    assert proc.returncode == 0, proc.stderr
    assert "actor_rollout_ref.actor.optim.lr=1e-6" in proc.stdout and "data.max_prompt_length=2048" in proc.stdout


@pytest.mark.parametrize("path", ["/d/a b.parquet", "/d/it's.parquet", "/d/x\\'y", "/d/${oc.env:HOME}", "/d/a\\\\",
                                  "/d/\\${x}", "C:\\data\\"])  # fmt: skip
def test_hydra_str_composes_to_the_exact_string(path: str):
    from rpg.launch import compose_config

    cfg = compose_config([f"trainer.default_local_dir={ra.hydra_str(path)}"])
    assert cfg.trainer.default_local_dir == path


def test_hydra_files_splits_lines_and_keeps_lists():
    assert ra.hydra_files("/a b.parquet\n\n/c.parquet") == "['/a b.parquet','/c.parquet']"
    assert ra.hydra_files("['/x.parquet']") == "['/x.parquet']"


def test_a_bad_whole_number_knob_is_refused(tmp_path):
    script = tmp_path / "run_probe.sh"
    script.write_text(f'source "{RECIPE}/common.sh"\nPROMPT_LEN=4k\nrpg_run "$@"\n')
    proc = run_script(script, RPG_PRINT_ARGV="1")
    assert proc.returncode == 2 and "PROMPT_LEN='4k' is not valid: give a whole number" in proc.stderr, proc.stderr


def test_stdlib_only():
    """common.sh runs recipe_argv.py as a file with any python3: it imports nothing outside the standard library."""
    import sys

    code = "import sys; sys.modules['rpg'] = None; import runpy; runpy.run_path(sys.argv[1], run_name='x')"
    proc = subprocess.run([sys.executable, "-I", "-c", code, ra.__file__], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------------------------------------------------
# OLD_LOGPROB and TRAINER_MODE (docs/async.md#knobs): environment knobs, passed only when not the default
# ----------------------------------------------------------------------------------------------------------------------
BYPASS = "algorithm.rollout_correction.bypass_mode=True"


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
    script = tmp_path / "run_probe.sh"
    script.write_text(f'source "{RECIPE}/common.sh"\npreset_rpg_reinforce urkl 1e-4\nrpg_run "$@"\n')
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
    script = tmp_path / "run_probe.sh"
    script.write_text(f'source "{RECIPE}/common.sh"\nrpg_run "$@"\n')
    proc = run_script(script, RPG_PRINT_ARGV="1", **{name: value})
    assert proc.returncode == 2, proc.stdout
    assert f"{name}='{value}' is not valid; choose one of: {choices}" in proc.stderr, proc.stderr


def test_schedule_free_with_an_async_trainer_mode_is_refused(tmp_path):
    script = tmp_path / "run_probe.sh"
    script.write_text(f'source "{RECIPE}/common.sh"\npreset_dapo\nrpg_run "$@"\n')
    proc = run_script(script, RPG_PRINT_ARGV="1", OPTIM="schedulefree", TRAINER_MODE="colocate_async")
    assert proc.returncode == 2, proc.stdout
    assert "TRAINER_MODE='colocate_async' with OPTIM=schedulefree" in proc.stderr, proc.stderr
    assert "no asynchronous" in proc.stderr, proc.stderr
