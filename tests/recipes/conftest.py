"""Fixtures of the recipe tests."""

import pytest


@pytest.fixture(scope="session")
def stub_optim_dir(tmp_path_factory) -> str:
    """A stand-in for recipe/rpg/optim/ whose schedulefree.sh adds no override, so the rest of a schedule-free
    script's config can be checked whether or not schedule-free support has landed."""
    d = tmp_path_factory.mktemp("optim")
    (d / "schedulefree.sh").write_text("RPG_OPTIM_OVERRIDES=()\n")
    return str(d)
