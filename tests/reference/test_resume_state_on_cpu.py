"""Resuming a periodic-reference run keeps its promise or refuses (rpg/reference/written.py `WrittenReference.load`).

A checkpoint without the reference state must not silently restart from the initial model; a corrupt state file is
named; a non-finite KL moving average is rejected. The launcher's resume check (rpg/preflight/resume_ckpt.py) expects
exactly the files these writers save, under the names they define. Fake engines (no verl worker): < 1 s.
"""

from __future__ import annotations

import inspect
import json
import os
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rpg.preflight import resume_ckpt
from rpg.reference import adaptive_kl, written
from rpg.reference.adaptive_kl import AdaptiveBeta, AdaptiveKLCoef
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


# ---- the launcher's resume check reads the names these writers save under (rpg/preflight/resume_ckpt.py) ----------
def _resume_config(folder):
    return OmegaConf.create({
        "algorithm": {"adv_estimator": "rpg"},
        "critic": {"enable": False},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1, "resume_mode": "auto", "default_local_dir": str(folder),
                    "v1": {"trainer_mode": "sync"}},
        "actor_rollout_ref": {"actor": {"policy_loss": {"reference": "periodic", "kl_control": "adaptive"}}},
    })


def _write_rpg_state(step_dir):
    """What the writers save at a checkpoint: the periodic reference after one refresh (state + weights) and the
    adaptive β's state."""
    ctl = _periodic()
    assert ctl.schedule.update(0.01, 4)  # K = 4 optimizer steps: a refresh, so the weights are saved too
    ctl.save(str(step_dir / "actor"), global_step=1)
    AdaptiveBeta(AdaptiveKLCoef(1e-3, 1e-3, 10.0)).save(str(step_dir / "actor"), global_step=1)


def _rpg_pieces(cfg, step_dir):
    return {rel for rel, _ in resume_ckpt.expected(cfg, step_dir) if "/rpg_" in rel}


def test_the_resume_check_expects_what_the_writers_write(tmp_path):
    step_dir = tmp_path / "global_step_1"
    _write_rpg_state(step_dir)
    cfg = _resume_config(tmp_path)
    pieces = _rpg_pieces(cfg, step_dir)
    assert pieces == {resume_ckpt.REFERENCE_STATE, resume_ckpt.REFERENCE_WEIGHTS, resume_ckpt.KL_CONTROL}
    assert all((step_dir / rel).is_file() for rel in pieces), sorted(p for p in pieces if not (step_dir / p).is_file())
    missing = {rel for rel, _ in resume_ckpt.missing(cfg, step_dir)}
    assert not missing & pieces


@pytest.mark.parametrize("module,name", [(written, "STATE_FILE"), (written, "REF_MODEL_DIR"),
                                         (adaptive_kl, "KL_CONTROL_FILE")])
def test_a_writer_renaming_its_file_is_seen_by_the_resume_check(tmp_path, monkeypatch, module, name):
    """The mutant: a writer that saves under another name (the check's names copied, not read from the writer)
    leaves a checkpoint the resume check calls incomplete."""
    monkeypatch.setattr(module, name, getattr(module, name) + ".renamed")
    step_dir = tmp_path / "global_step_1"
    _write_rpg_state(step_dir)
    missing = {rel for rel, _ in resume_ckpt.missing(_resume_config(tmp_path), step_dir)}
    assert missing & _rpg_pieces(_resume_config(tmp_path), step_dir), missing


def test_the_resume_checks_verl_names_are_verls():
    """verl's names in the check (its tracker file, the per-rank file prefixes of FSDPCheckpointManager's save)."""
    from verl.utils.checkpoint import checkpoint_manager, fsdp_checkpoint_manager

    assert checkpoint_manager.get_checkpoint_tracker_filename("root") == os.path.join("root", resume_ckpt.TRACKER)
    save = inspect.getsource(fsdp_checkpoint_manager.FSDPCheckpointManager.save_checkpoint)
    for prefix in resume_ckpt.RANK_FILES.values():
        assert f'f"{prefix}_world_size_{{self.world_size}}_rank_{{self.rank}}.pt"' in save, prefix
