"""The periodic-reference schedule (rpg/reference/schedule.py `RefreshSchedule`, paper §5): K, κ, EMA, resume. <1 s."""

import json

import pytest

from rpg.reference.schedule import RefreshSchedule


def run(schedule, steps):
    """Feed (kl, optimizer_steps) pairs; return the 1-based training steps at which a refresh fired."""
    return [t for t, (kl, n) in enumerate(steps, start=1) if schedule.update(kl, n)]


def test_refresh_every_k_optimizer_steps():
    s = RefreshSchedule(every_steps=4)
    assert run(s, [(0.0, 1)] * 12) == [4, 8, 12]
    assert [h["optimizer_step"] for h in s.state.history] == [4, 8, 12]
    assert {h["reason"] for h in s.state.history} == {"steps"}


def test_k_counts_optimizer_steps_and_fires_at_the_next_training_step_boundary():
    # 2 mini-batches per training step: K=4 -> every 2nd training step; K=3 -> also every 2nd (4 >= 3, counter resets)
    assert run(RefreshSchedule(every_steps=4), [(None, 2)] * 6) == [2, 4, 6]
    s = RefreshSchedule(every_steps=3)
    assert run(s, [(None, 2)] * 6) == [2, 4, 6]
    assert [h["optimizer_step"] for h in s.state.history] == [4, 8, 12]
    # K equal to the optimizer steps of one training step = refresh after every step (the iterative scheme)
    assert run(RefreshSchedule(every_steps=16), [(None, 16)] * 3) == [1, 2, 3]


def test_kl_threshold_on_the_moving_average():
    s = RefreshSchedule(kl_threshold=0.1, ema_decay=0.5)
    # ema: 0.04 -> 0.07 -> 0.085 -> 0.0925 -> 0.11 (> κ: refresh, restart) -> 0.04 ...
    kls = [0.04, 0.1, 0.1, 0.1, 0.13, 0.04, 0.04]
    fired = run(s, [(k, 1) for k in kls])
    assert fired == [5]
    assert s.state.history[0]["reason"] == "kl"
    assert s.state.history[0]["kl_ema"] == pytest.approx(0.11125)
    assert s.state.kl_ema == pytest.approx(0.04)  # restarted at the refresh: the first value after it is the KL itself


def test_single_spike_does_not_fire_with_smoothing_but_does_without():
    kls = [0.01, 0.5, 0.01, 0.01]
    assert run(RefreshSchedule(kl_threshold=0.2, ema_decay=0.9), [(k, 1) for k in kls]) == []
    assert run(RefreshSchedule(kl_threshold=0.2, ema_decay=0.0), [(k, 1) for k in kls]) == [2]


def test_both_criteria_and_none_kl():
    s = RefreshSchedule(every_steps=5, kl_threshold=0.3, ema_decay=0.0)
    fired = run(s, [(0.0, 1), (0.5, 1), (None, 1), (0.0, 1), (0.0, 1), (0.0, 1), (0.0, 1)])
    # step 2: KL; then 5 optimizer steps later (step 7): K
    assert fired == [2, 7]
    assert [h["reason"] for h in s.state.history] == ["kl", "steps"]


def test_resume_reproduces_the_refresh_steps():
    trace = [((0.02 * (t % 7)), 1 + t % 3) for t in range(40)]
    cfg = dict(every_steps=9, kl_threshold=0.08, ema_decay=0.7)
    full = RefreshSchedule(**cfg)
    fired_full = run(full, trace)
    assert len(fired_full) >= 3 and {h["reason"] for h in full.state.history} == {"steps", "kl"}

    for cut in (1, 13, 17, 29):
        first = RefreshSchedule(**cfg)
        fired = run(first, trace[:cut])
        saved = json.loads(json.dumps(first.state_dict()))  # through JSON, as the checkpoint stores it
        resumed = RefreshSchedule(**cfg)
        resumed.load_state_dict(saved)
        fired += [cut + t for t in run(resumed, trace[cut:])]
        assert fired == fired_full, f"cut at {cut}"
        assert resumed.state_dict() == full.state_dict()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(), "K\\) > 0 and/or"),
        (dict(every_steps=-1), "every_steps"),
        (dict(every_steps=1.5), "every_steps"),
        (dict(kl_threshold=float("nan")), "kl_threshold"),
        (dict(every_steps=1, ema_decay=1.0), "ema_decay"),
    ],
)
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RefreshSchedule(**kwargs)


def test_bad_state_and_step_count_are_named():
    s = RefreshSchedule(every_steps=2)
    with pytest.raises(ValueError, match="optimizer_steps"):
        s.update(0.0, 0)
    with pytest.raises(ValueError, match="missing keys"):
        s.load_state_dict({"train_steps": 1})
