"""Unit tests of rpg/schedule_free.py (and its verl subclasses, rpg/schedule_free_trainer.py and
rpg/schedule_free_worker.py) without an engine: parameter-set switching, the trainer's validation hooks (call
order, with fakes for the worker group and verl's checkpoint-engine manager), trainer/worker registration and the
config check."""

from __future__ import annotations

import pytest
import torch

import rpg.schedule_free as sfm
import rpg.schedule_free_trainer as sft
import rpg.schedule_free_worker as sfw


def _sf_model(steps: int, seed: int = 0):
    import schedulefree

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = schedulefree.AdamWScheduleFree(model.parameters(), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.1)
    opt.train()
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed))
    for _ in range(steps):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    return model, opt


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def test_average_is_schedulefree_x_and_iterate_is_restored_bit_exactly():
    model, opt = _sf_model(steps=3)
    sf = sfm.ScheduleFreeIterates(opt)
    y = _snapshot(model)
    beta1 = opt.param_groups[0]["betas"][0]
    assert sf.current == sfm.ITERATE and sf.has_average()
    assert sf.use_average() is True and sf.current == sfm.AVERAGE
    for p, yp in zip(model.parameters(), y):  # x = y + (1 − 1/β1)(z − y)  (schedulefree's eval())
        torch.testing.assert_close(p, yp + (1 - 1 / beta1) * (opt.state[p]["z"] - yp), rtol=0, atol=1e-6)
    assert any(not torch.equal(p, yp) for p, yp in zip(model.parameters(), y))
    assert sf.use_average() is False  # idempotent
    assert sf.use_iterate() is True and sf.current == sfm.ITERATE
    assert all(torch.equal(p, yp) for p, yp in zip(model.parameters(), y))
    assert all(g["train_mode"] for g in opt.param_groups)


def test_inverse_interpolation_is_not_exact_which_is_why_y_is_copied():
    """The copy matters: schedulefree's own train() after eval() does not give y back bit-exactly."""
    import schedulefree

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(100_000))
    opt = schedulefree.AdamWScheduleFree([w], lr=1e-2)
    opt.train()
    for _ in range(3):
        opt.zero_grad()
        (w - 1).pow(2).sum().backward()
        opt.step()
    y = w.detach().clone()
    opt.eval()
    opt.train()
    assert not torch.equal(w, y)  # a few elements differ by 1 ulp (~26 of 100k here)
    torch.testing.assert_close(w.detach(), y, rtol=0, atol=1e-6)


def test_before_first_step_x_equals_y_and_nothing_needs_resync():
    model, opt = _sf_model(steps=0)
    sf = sfm.ScheduleFreeIterates(opt)
    y = _snapshot(model)
    assert not sf.has_average()
    assert sf.use_average() is False and sf.current == sfm.AVERAGE
    assert sf.use_iterate() is False and sf.current == sfm.ITERATE
    assert all(torch.equal(p, yp) for p, yp in zip(model.parameters(), y))


def test_average_context_restores_iterate_on_error():
    model, opt = _sf_model(steps=2)
    sf = sfm.ScheduleFreeIterates(opt)
    y = _snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        with sf.average() as changed:
            assert changed
            raise RuntimeError("boom")
    assert sf.current == sfm.ITERATE and all(torch.equal(p, yp) for p, yp in zip(model.parameters(), y))


def test_after_load_of_an_eval_mode_checkpoint_converts_to_y():
    """A checkpoint written in eval mode (e.g. by the authors' code) is turned into y with schedulefree's train()."""
    model, opt = _sf_model(steps=3)
    opt.eval()
    x = _snapshot(model)
    sf = sfm.ScheduleFreeIterates(opt)
    sf.after_load()
    assert sf.current == sfm.ITERATE
    assert any(not torch.equal(p, xp) for p, xp in zip(model.parameters(), x))


def test_bad_inputs_are_named():
    model, opt = _sf_model(steps=1)
    with pytest.raises(ValueError, match=r"one of \['iterate', 'average'\]"):
        sfm.ScheduleFreeIterates(opt).use("x")
    adamw = torch.optim.AdamW(model.parameters())
    assert not sfm.is_schedule_free(adamw)
    with pytest.raises(TypeError, match="not a schedule-free optimizer"):
        sfm.ScheduleFreeIterates(adamw)


def test_optimizer_state_round_trip_continues_identically():
    """Optimizer state_dict saved in train mode (with y) restores the same trajectory (what verl's checkpoint
    manager saves: model state_dict + optimizer state_dict)."""
    import schedulefree

    model, opt = _sf_model(steps=3)
    model_sd = {k: v.clone() for k, v in model.state_dict().items()}
    opt_sd = torch.load(_roundtrip(opt.state_dict()), weights_only=False)
    assert opt_sd["param_groups"][0]["train_mode"] is True
    clone, _ = _sf_model(steps=0, seed=1)
    clone.load_state_dict(model_sd)
    opt2 = schedulefree.AdamWScheduleFree(clone.parameters(), lr=1e-2, weight_decay=0.1)
    opt2.load_state_dict(opt_sd)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))
    for m, o in ((model, opt), (clone, opt2)):
        for _ in range(2):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), clone.parameters()))


def _roundtrip(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


# ---------------------------------------------------------------- trainer hooks (fakes for Ray-side objects)


class _Log(list):
    pass


class _FakeWorkerGroup:
    def __init__(self, log, changes):
        self.log, self.changes = log, changes

    def set_schedule_free_weights(self, weights):
        self.log.append(("set", weights))
        return [self.changes] * 2  # one answer per rank


class _FakeCheckpointManager:
    def __init__(self, log):
        self.log = log

    def sleep_replicas(self):
        self.log.append(("sleep",))

    def update_weights(self, global_steps=None):
        self.log.append(("update_weights", global_steps))


def _trainer(changes: bool):
    log = _Log()
    trainer = object.__new__(sft.ScheduleFreeSyncTrainer)  # hooks only: no Ray, no workers
    trainer.actor_rollout_wg = _FakeWorkerGroup(log, changes)
    trainer.checkpoint_manager = _FakeCheckpointManager(log)
    trainer.global_steps = 10
    return trainer, log


def test_validation_hooks_push_average_then_iterate():
    trainer, log = _trainer(changes=True)
    trainer.on_validate_begin()
    assert log == [("set", "average"), ("sleep",), ("update_weights", 10)]
    log.clear()
    trainer.on_validate_end()
    assert log == [("set", "iterate"), ("sleep",), ("update_weights", 10)]


def test_validation_hooks_skip_resync_when_weights_did_not_change():
    trainer, log = _trainer(changes=False)
    trainer.on_validate_begin()
    trainer.on_validate_end()
    assert log == [("set", "average"), ("set", "iterate")]


def test_trainer_is_registered_by_install_and_behaves_as_sync_trainer():
    from verl.trainer.ppo.v1 import get_trainer_cls

    from rpg import install

    install.install([install.SCHEDULE_FREE])  # where RPG_INSTALL names it (tests/test_scoped_patches_on_cpu.py)
    install.install([install.SCHEDULE_FREE])  # idempotent
    assert install.installed(install.SCHEDULE_FREE) and get_trainer_cls(sfm.TRAINER_MODE) is sft.ScheduleFreeSyncTrainer
    trainer = object.__new__(sft.ScheduleFreeSyncTrainer)
    trainer.trainer_mode = sfm.TRAINER_MODE  # what PPOTrainer.__init__ does
    assert trainer.trainer_mode == "sync"


def _compose(*overrides):
    from cpu_worker import compose_ppo_trainer

    return compose_ppo_trainer(*overrides)


SF = ("actor_rollout_ref.actor.optim.optimizer_impl=schedulefree",
      "actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFree")


def test_trainer_uses_the_schedule_free_worker_class():
    from verl.workers.engine_workers import ActorRolloutRefWorker

    trainer = object.__new__(sft.ScheduleFreeSyncTrainer)
    trainer.config = _compose(*SF, f"trainer.v1.trainer_mode={sfm.TRAINER_MODE}")
    trainer._init_resource_pool_mgr()
    classes = {sft._remote_class(c) for c in trainer.role_worker_mapping.values()}
    assert sfw.ScheduleFreeActorRolloutRefWorker in classes and ActorRolloutRefWorker not in classes


def test_check_config_accepts_the_recipe_combination():
    assert sfm.check_config(_compose(*SF, f"trainer.v1.trainer_mode={sfm.TRAINER_MODE}")) is True
    assert sfm.check_config(_compose()) is False  # AdamW + verl's sync trainer: nothing to do


@pytest.mark.parametrize(
    "overrides, message",
    [
        (SF, r"schedule-free optimizer .* trainer.v1.trainer_mode=sync: set .*trainer_mode=schedule_free_sync"),
        ((*SF, "trainer.use_v1=False"), r"trainer.use_v1=False"),
        ((*SF, "trainer.v1.trainer_mode=colocate_async"), r"trainer_mode=colocate_async.*no asynchronous"),
        ((f"trainer.v1.trainer_mode={sfm.TRAINER_MODE}",), r"needs a schedule-free actor optimizer, got torch.optim.AdamW"),
        (("actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFreeTypo",
          "actor_rollout_ref.actor.optim.optimizer_impl=schedulefree"), r"cannot import optimizer schedulefree\.AdamW"),
    ],
)
def test_check_config_refuses_inconsistent_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        sfm.check_config(_compose(*overrides))


def test_verl_build_optimizer_gives_the_recipe_hyperparameters():
    """verl's own builder (optimizer_impl + optimizer) passes lr, weight_decay and betas
    (docs/schedule-free.md#settings)."""
    import schedulefree
    from verl.workers.config.optimizer import FSDPOptimizerConfig, build_optimizer

    cfg = FSDPOptimizerConfig(lr=1e-6, weight_decay=0.1, lr_warmup_steps=10, optimizer_impl="schedulefree",
                              optimizer="AdamWScheduleFree")
    opt = build_optimizer(torch.nn.Linear(2, 2).parameters(), cfg)
    assert isinstance(opt, schedulefree.AdamWScheduleFree)
    g = opt.param_groups[0]
    assert (g["lr"], g["weight_decay"], tuple(g["betas"]), g["warmup_steps"]) == (1e-6, 0.1, (0.9, 0.999), 0)
