"""Fixtures of the multi-rank tests: one pool of 2 gloo ranks shared by the whole session (the tiny model is
tests/conftest.py's `tiny_qwen2_dir`)."""

import pytest


@pytest.fixture(scope="session")
def two_ranks():
    """2 spawned processes in one gloo process group (tests/ranks/rank_pool.py); closed at the end of the session."""
    from rank_pool import RankPool

    pool = RankPool(world_size=2)
    yield pool
    pool.close()
