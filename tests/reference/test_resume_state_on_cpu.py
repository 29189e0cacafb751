"""Resuming a periodic-reference run keeps its promise or refuses (rpg/reference/written.py `WrittenReference.load`).

A checkpoint without the reference state must not silently restart from the initial model; a corrupt state file is
named; a non-finite KL moving average is rejected. Fake engines (no verl worker): < 1 s.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from rpg.reference.periodic import PeriodicReference
from rpg.reference.schedule import RefreshSchedule


def _worker():
    engine = SimpleNamespace(module=torch.nn.Linear(2, 2), optimizer_step=lambda: None)
    return SimpleNamespace(engine=engine)


def _periodic():
    return PeriodicReference(RefreshSchedule(every_steps=4), _worker(), _worker())


def _saved(tmp_path, **schedule_updates) -> str:
    """An actor checkpoint folder with a saved schedule (no refresh yet: no weights)."""
    ctl = _periodic()
    ctl.schedule.update(0.01, 2)
    ckpt = str(tmp_path / "global_step_1" / "actor")
    ctl.save(ckpt, global_step=1)
    if schedule_updates:
        path = os.path.join(ckpt, "rpg_reference", "state.json")
        with open(path) as f:
            payload = json.load(f)
        payload["schedule"].update(schedule_updates)
        with open(path, "w") as f:
            f.write(json.dumps(payload))  # json writes NaN as the bare token NaN
    return ckpt


def test_round_trip(tmp_path):
    ckpt = _saved(tmp_path)
    resumed = _periodic()
    resumed.load(ckpt)
    assert resumed.schedule.state.train_steps == 1 and resumed.schedule.state.kl_ema == pytest.approx(0.01)


def test_checkpoint_without_reference_state_is_refused_with_path_and_fix(tmp_path):
    ckpt = tmp_path / "global_step_7" / "actor"
    ckpt.mkdir(parents=True)
    with pytest.raises(RuntimeError) as info:
        _periodic().load(str(ckpt))
    message = str(info.value)
    assert str(ckpt / "rpg_reference" / "state.json") in message
    assert "reference=" in message and "resume_mode=disable" in message


def test_corrupt_state_file_is_named(tmp_path):
    ckpt = _saved(tmp_path)
    path = os.path.join(ckpt, "rpg_reference", "state.json")
    with open(path, "w") as f:
        f.write('{"version": 1, "schedule": {"train_st')  # truncated
    with pytest.raises(ValueError, match=path):
        _periodic().load(ckpt)


@pytest.mark.parametrize("bad", [{"train_steps": "three"}, {"history": None}, {"kl_ema": "0.1"}])
def test_malformed_state_is_named(tmp_path, bad):
    ckpt = _saved(tmp_path, **bad)
    with pytest.raises(ValueError, match=os.path.join(ckpt, "rpg_reference", "state.json")):
        _periodic().load(ckpt)


@pytest.mark.parametrize("ema", [float("nan"), float("inf"), -0.5])
def test_non_finite_or_negative_kl_ema_is_rejected(tmp_path, ema):
    ckpt = _saved(tmp_path, kl_ema=ema)
    with pytest.raises(ValueError, match="kl_ema"):
        _periodic().load(ckpt)


def test_non_finite_kl_ema_is_rejected_by_the_schedule():
    s = RefreshSchedule(every_steps=2)
    state = dict(s.state_dict(), kl_ema=float("nan"))
    with pytest.raises(ValueError, match="kl_ema"):
        s.load_state_dict(state)
