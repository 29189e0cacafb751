"""The table of verl patch points (rpg/patches.py): for every selection of RPG_INSTALL names, each verl object of the
table carries exactly one rpg wrapper (followed through `__wrapped__` down to verl's own object) when a selected name
hooks it and is verl's own object otherwise; uninstalling name by name keeps that true, and uninstalling everything
gives every point verl's identical object back. The mutant that wraps `ppo_loss` a second time fails the check.
One process: verl is imported once (~10 s), every selection is installed and uninstalled in it.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import sys
import types

import pytest

from rpg import install, modes, patches
from rpg.schedule_free import PIECES as SCHEDULE_FREE_PIECES
from rpg.schedule_free import TRAINER_MODE

SELECTIONS = [s for k in range(len(install.NAMES) + 1) for s in itertools.combinations(install.NAMES, k)]


def _owner(point: patches.Point):
    module = importlib.import_module(point.module)
    return getattr(module, point.owner) if point.owner else module


def _at(point: patches.Point):
    """The object at `point` now (a registry row: the registered value, or None)."""
    owner = _owner(point)
    if point.registry:
        return owner.get(point.attribute)
    return vars(owner)[point.attribute] if isinstance(owner, type) else getattr(owner, point.attribute)


def _chain(obj) -> list:
    """`obj` and everything it wraps (`__wrapped__`), outermost first."""
    chain = [obj]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    return chain


def _marked(obj) -> bool:
    return patches.MARK in getattr(obj, "__dict__", {})


def check_state(selection, originals) -> None:
    """AssertionError unless every point hooked by `selection` carries exactly one rpg wrapper whose innermost object
    is verl's own, and every other point holds verl's own object (identity)."""
    for point in patches.POINTS:
        now, hooked = _at(point), bool(set(selection) & set(point.installs))
        if point.registry:
            assert (now is not None and _marked(now)) is hooked, (point.where, selection, now)
            assert hooked or now is originals[point], (point.where, selection)
            continue
        chain = _chain(now)
        wrappers = sum(map(_marked, chain))
        assert wrappers == int(hooked), f"{point.where}: {wrappers} rpg wrappers with {selection}"
        assert (chain[1] if hooked else now) is originals[point], (point.where, selection)  # verl's own object
        if hooked:
            assert set(patches.patch_of(now).pieces) == set(selection) & set(point.installs), point.where


@pytest.fixture(scope="module")
def originals():
    import verl  # noqa: F401  (the plugin: with no RPG_INSTALL it installs nothing)

    before = [n for n in install.NAMES if install.installed(n)]  # a session fixture's (conftest.ref_log_prob_adapter)
    install.uninstall()
    for point in patches.POINTS:
        importlib.import_module(point.module)
    state = {p: _at(p) for p in patches.POINTS}
    assert all(not _marked(obj) for obj in state.values() if obj is not None)
    yield state
    install.uninstall()
    install.install(before)  # the later modules of this process find what they found before


def test_every_selection_wraps_each_point_once_and_uninstall_restores_verls_objects(originals):
    for selection in SELECTIONS:
        install.install(selection)
        install.install(selection)  # idempotent
        check_state(selection, originals)
        assert all(install.installed(n) is (n in selection) for n in install.NAMES), selection
        remaining = list(selection)
        for name in reversed(selection):  # name by name: the others stay, each point still wrapped once
            install.uninstall([name])
            remaining.remove(name)
            check_state(remaining, originals)
        install.install(selection)
        install.uninstall()  # all at once
        check_state((), originals)


def test_the_check_fails_when_ppo_loss_is_wrapped_a_second_time(originals):
    """The mutant: a second wrapper on `ppo_loss` (what the adapter and the top-k hook did before the table)."""
    import verl.workers.utils.losses as losses

    point = next(p for p in patches.POINTS if p.module == patches.LOSSES and p.attribute == "ppo_loss")
    try:
        install.install([install.REF_LOG_PROB, install.TOPK_KL])
        check_state([install.REF_LOG_PROB, install.TOPK_KL], originals)
        losses.ppo_loss = patches._wrap(point, losses.ppo_loss)  # a second wrap, through the table's own wrapper
        with pytest.raises(AssertionError, match="2 rpg wrappers"):
            check_state([install.REF_LOG_PROB, install.TOPK_KL], originals)
        inner = losses.ppo_loss.__wrapped__
        losses.ppo_loss = functools.wraps(inner)(lambda *a, **k: inner(*a, **k))  # or any functools.wraps wrapper
        with pytest.raises(AssertionError, match="2 rpg wrappers"):
            check_state([install.REF_LOG_PROB, install.TOPK_KL], originals)
        losses.ppo_loss = inner
    finally:
        install.uninstall()
    check_state((), originals)


def test_the_pieces_run_once_each_in_the_rows_order():
    """One wrapper dispatches to every installed piece of its point, outermost first in the row's order."""
    calls = []

    def verls(x):
        calls.append("verl")
        return x + 1

    def piece(tag):
        def run(call, x):
            calls.append(tag)
            return call(x) * 10

        return run

    point = patches.Point("m", "", "f", ("x",), ("a", "b"))
    wrapper = patches._wrap(point, verls)
    patch = patches.patch_of(wrapper)
    patch.set("b", piece("b"))
    patch.set("a", piece("a"))
    assert wrapper(1) == 200 and calls == ["a", "b", "verl"]
    patch.set("a", None)
    calls.clear()
    assert wrapper(1) == 20 and calls == ["b", "verl"] and wrapper.__wrapped__ is verls


def test_each_name_has_a_piece_for_exactly_its_rows_and_the_names_match_their_owners():
    for name in install.NAMES:
        assert set(patches.pieces(name)) == {p.attribute for p in patches.points([name])}, name
    assert {install.REF_LOG_PROB, install.WORKER_HOOKS} == {modes.REF_LOG_PROB, modes.WORKER_HOOKS}
    assert patches.SCHEDULE_FREE_TRAINER == TRAINER_MODE and set(SCHEDULE_FREE_PIECES) == {TRAINER_MODE}
    assert len({p.where for p in patches.POINTS}) == len(patches.POINTS)  # one row per verl object


def test_periodic_reference_is_an_alias_of_worker_hooks():
    assert install.WORKER_HOOKS == "worker_hooks"
    assert install.names("ref_log_prob, periodic_reference") == (install.REF_LOG_PROB, install.WORKER_HOOKS)
    assert install.names("periodic_reference,worker_hooks") == (install.WORKER_HOOKS,)
    with pytest.raises(ValueError, match="periodic_reference"):  # the message lists the aliases too
        install.names("periodic")


def test_a_coroutine_where_verl_had_a_function_is_refused(monkeypatch):
    """The wrapper and its pieces are synchronous: an async verl object at a point is a guard failure."""

    async def ppo_loss(config, model_output, data, dp_group=None):
        return None

    fake = types.ModuleType("rpg_test_fake_verl")
    fake.ppo_loss = ppo_loss
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    point = patches.Point(fake.__name__, "", "ppo_loss", patches.PPO_LOSS, (install.REF_LOG_PROB,))
    monkeypatch.setattr(patches, "POINTS", (point,))
    with pytest.raises(RuntimeError, match="rpg_test_fake_verl.ppo_loss is a coroutine function"):
        install.install([install.REF_LOG_PROB])
    assert fake.ppo_loss is ppo_loss
