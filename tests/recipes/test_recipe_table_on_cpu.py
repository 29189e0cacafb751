"""The recipe scripts are generated from one table (rpg/recipe_table.py, `python -m rpg.tools.recipes`): a script that
drifts from its row, a script without a row, or a row without a script fails here; each script is one line of group
choices that the config groups of rpg/config/ know."""

from __future__ import annotations

import re

from recipe_helpers import RECIPE

from rpg.preflight.compose import CONFIG_DIR
from rpg.recipe_table import RECIPES
from rpg.tools import recipes


def test_every_script_is_generated_from_its_row():
    assert recipes.drift() == [], "run: python -m rpg.tools.recipes --write"


def test_drift_is_detected(tmp_path):
    """The check can fail: an edited script, a missing one and one the table does not have are all reported."""
    import shutil

    for d in recipes.DIRECTORIES:
        shutil.copytree(RECIPE / d, tmp_path / d)
    first, second = RECIPES[0], RECIPES[1]
    (tmp_path / first.path).write_text((tmp_path / first.path).read_text().replace('"$@"', 'LR=1 "$@"'))
    (tmp_path / second.path).unlink()
    (tmp_path / "7b" / "run_extra.sh").write_text("")
    problems = "\n".join(recipes.drift(tmp_path))
    assert f"{first.path}: differs" in problems and f"{second.path}: missing" in problems
    assert "7b/run_extra.sh: not in rpg/recipe_table.py" in problems


def test_each_script_is_one_line_of_choices_the_groups_know():
    groups = {d.name: {p.stem for p in d.glob("*.yaml")} for d in CONFIG_DIR.iterdir() if d.is_dir()}
    assert set(groups) == {"setup", "method", "optim", "profile"}
    for recipe in RECIPES:
        code = [line for line in (RECIPE / recipe.path).read_text().splitlines() if not line.startswith("#")]
        assert len(code) == 1 and code[0].endswith('"$@"'), recipe.path
        for choice in recipe.choices:
            key, _, value = choice.partition("=")
            assert re.fullmatch(r"[A-Za-z0-9_.+]+", key) and value, choice
            if key in groups:
                assert value in groups[key], f"{recipe.path}: {choice} is not a config of rpg/config/{key}/"
