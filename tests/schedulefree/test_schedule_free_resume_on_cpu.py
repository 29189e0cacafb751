"""Resuming with the other optimizer (schedule-free <-> AdamW) is refused with both optimizers named and the fix,
at launch (`check_config` reads the optimizer state verl would load) and, for a schedule-free worker, at load time
(`ScheduleFreeIterates.after_load`), instead of a bare `KeyError` from deep inside torch or schedulefree."""

from __future__ import annotations

import os

import pytest
import torch

import rpg.schedule_free as sfm

SF = (
    "actor_rollout_ref.actor.optim.optimizer_impl=schedulefree",
    "actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFree",
    f"trainer.v1.trainer_mode={sfm.TRAINER_MODE}",
)


def _compose(*overrides):
    from cpu_worker import compose_ppo_trainer

    return compose_ppo_trainer(*overrides)


def _optimizer(schedule_free: bool):
    import schedulefree

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    if schedule_free:
        opt = schedulefree.AdamWScheduleFree(model.parameters(), lr=1e-2)
        opt.train()
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return model, opt


def _checkpoint(root, schedule_free: bool, step: int = 20) -> str:
    """A verl checkpoint folder as far as the optimizer is concerned: global_step_N/actor/optim_*.pt + the tracker."""
    actor = root / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    torch.save(_optimizer(schedule_free)[1].state_dict(), actor / "optim_world_size_2_rank_0.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return str(root / f"global_step_{step}")


@pytest.mark.parametrize("mode", ["auto", "resume_path"])
def test_schedule_free_run_refuses_an_adamw_checkpoint(tmp_path, mode):
    folder = _checkpoint(tmp_path, schedule_free=False)
    resume = ([f"trainer.default_local_dir={tmp_path}"] if mode == "auto" else
              ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}"])
    with pytest.raises(ValueError) as info:
        sfm.check_config(_compose(*SF, *resume))
    message = str(info.value)
    assert "AdamWScheduleFree" in message and "AdamW" in message.replace("AdamWScheduleFree", "")
    assert os.path.join(folder, "actor") in message and "OPTIM=adamw" in message and "resume_mode=disable" in message


def test_adamw_run_refuses_a_schedule_free_checkpoint(tmp_path):
    folder = _checkpoint(tmp_path, schedule_free=True)
    with pytest.raises(ValueError) as info:
        sfm.check_config(_compose(f"trainer.default_local_dir={tmp_path}"))
    message = str(info.value)
    assert "torch.optim.AdamW" in message and "AdamWScheduleFree" in message and "OPTIM=schedulefree" in message
    assert os.path.join(folder, "actor") in message


@pytest.mark.parametrize("schedule_free", [True, False])
def test_same_optimizer_and_fresh_runs_pass(tmp_path, schedule_free):
    _checkpoint(tmp_path, schedule_free=schedule_free)
    overrides = (*SF,) if schedule_free else ()
    assert sfm.check_config(_compose(*overrides, f"trainer.default_local_dir={tmp_path}")) is schedule_free
    assert sfm.check_config(_compose(*overrides, f"trainer.default_local_dir={tmp_path / 'new'}")) is schedule_free
    assert sfm.check_config(_compose(*SF, f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=disable"))


def test_worker_load_of_adamw_state_names_both_optimizers():
    """The load-time guard of the schedule-free worker (when the launcher was bypassed)."""
    _, adamw = _optimizer(schedule_free=False)
    model, opt = _optimizer(schedule_free=True)
    iterates = sfm.ScheduleFreeIterates(opt)
    opt.load_state_dict(adamw.state_dict())  # what verl's checkpoint manager does on resume
    with pytest.raises(RuntimeError) as info:
        iterates.after_load()
    message = str(info.value)
    assert "AdamWScheduleFree" in message and "AdamW" in message.replace("AdamWScheduleFree", "")
    assert "OPTIM=adamw" in message
