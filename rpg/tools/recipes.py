"""Generate the recipe scripts from the recipe table: `python -m rpg.tools.recipes [--write | --check]`.

Each `recipe/rpg/<dir>/run_*.sh` is written from its row of `rpg.recipe_table.RECIPES`: the comment, then one line
that sources recipe/rpg/common.sh with the row's Hydra group choices and the user's arguments (`"$@"`). `--check`
(the default) lists the scripts that differ from the table, and scripts the table does not have, and exits 1 if any;
`--write` rewrites them (atomically) and removes nothing.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Optional

from rpg.atomic import atomic_write_text
from rpg.recipe_table import RECIPES, Recipe

RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipe" / "rpg"
DIRECTORIES = ("4b", "1gpu", "7b", "cpu")
SOURCE = 'source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"'


def script_text(recipe: Recipe) -> str:
    """The script of a table row."""
    comment = "".join(f"# {line}".rstrip() + "\n" for line in recipe.comment.splitlines())
    generated = ("# Generated from rpg/recipe_table.py (python -m rpg.tools.recipes --write): edit the table, not this "
                 "file.\n")
    line = " ".join([SOURCE, *(shlex.quote(c) for c in recipe.choices), '"$@"'])
    return f"#!/usr/bin/env bash\n{comment}{generated}{line}\n"


def drift(recipe_dir: Path = RECIPE_DIR) -> list[str]:
    """The scripts that differ from the table (or are missing), and the scripts the table does not have."""
    problems = []
    for recipe in RECIPES:
        path = recipe_dir / recipe.path
        if not path.is_file():
            problems.append(f"{recipe.path}: missing (python -m rpg.tools.recipes --write)")
        elif path.read_text() != script_text(recipe):
            problems.append(
                f"{recipe.path}: differs from its row of rpg/recipe_table.py (python -m rpg.tools.recipes --write)"
            )
    known = {r.path for r in RECIPES}
    for d in DIRECTORIES:
        for path in sorted((recipe_dir / d).glob("run_*.sh")):
            if f"{d}/{path.name}" not in known:
                problems.append(f"{d}/{path.name}: not in rpg/recipe_table.py (add a row, or remove the script)")
    return problems


def write(recipe_dir: Path = RECIPE_DIR) -> None:
    for recipe in RECIPES:
        path = recipe_dir / recipe.path
        atomic_write_text(path, script_text(recipe))
        path.chmod(0o755)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the scripts from the table")
    parser.add_argument("--check", action="store_true", help="list the scripts that drift from the table (default)")
    args = parser.parse_args(argv)
    if args.write:
        write()
    problems = drift()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
