"""Fixtures of the tests of rpg/tools (the tiny tokenizer is tests/conftest.py's `tiny_tokenizer`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prepare_data():
    from rpg.tools import prepare_data

    return prepare_data


@pytest.fixture(scope="session")
def report():
    from rpg.tools import report

    return report
