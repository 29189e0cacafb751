"""Every recipe resolves to the same dry-run config as recorded in dry_run_golden.txt (rpg.tools.dry_run_digest).

The launcher's plumbing (common.sh, rpg.launch, rpg.preflight) may be rewritten freely; what a recipe runs may not
change by accident. Each script's final command (RPG_PRINT_ARGV=1) is composed in this process as a dry run does, the
resolved YAML normalised (the checkout's directory written `<repo>`) and hashed. A deliberate change regenerates the
golden file in the same commit (the command is in the failure message) and says why in the commit message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rpg.tools import dry_run_digest as dd

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)

GOLDEN = Path(__file__).with_name("dry_run_golden.txt")


def test_golden_lists_every_recipe_script():
    assert sorted(dd.read_golden(GOLDEN)) == sorted(dd.name(s) for s in dd.scripts())


def test_every_recipe_resolves_to_its_golden_config():
    golden = dd.read_golden(GOLDEN)
    changed = [name for name, sha, _ in dd.digests() if golden.get(name) != sha]
    assert not changed, (
        f"{len(changed)} recipe(s) resolve to a different dry-run config than {GOLDEN.name}: {changed}.\n"
        "See what changed: python -m rpg.tools.dry_run_digest --yaml-dir /tmp/new, the same on the previous commit "
        "with --yaml-dir /tmp/old, then diff -r /tmp/old /tmp/new. If the change is deliberate: "
        "python -m rpg.tools.dry_run_digest --write tests/recipes/dry_run_golden.txt"
    )


def test_the_digest_sees_a_changed_setting(monkeypatch):
    """The comparison can fail: one changed override changes the digest."""
    script = dd.RECIPE / "4b" / "run_dapo_2k.sh"
    overrides = dd.script_overrides(script)
    base = dd.digest(dd.normalised_yaml(overrides))
    assert base == dd.read_golden(GOLDEN)[dd.name(script)]
    assert dd.digest(dd.normalised_yaml(overrides + ["trainer.test_freq=11"])) != base
