"""rpg/ray_start.py: the launcher's call of verl's run_ppo retries Ray's local start when the raylet misses Ray's
fixed 30 s (seen in fresh-clone test runs on a loaded machine), and only then."""

from __future__ import annotations

import types

import pytest

from rpg.ray_start import RAY_START_TRIES, retried_ray_start

TIMEOUT = Exception("The current node timed out during startup. This could happen because some of the raylet failed "
                    "to startup or the GCS has become overloaded.")  # fmt: skip


def fake_ray(failures):
    ray = types.SimpleNamespace(calls=[], shutdowns=0)

    def init(**kwargs):
        ray.calls.append(kwargs)
        if failures:
            raise failures.pop(0)
        return "context"

    def shutdown():
        ray.shutdowns += 1

    ray.init, ray.shutdown = init, shutdown
    return ray


def test_a_raylet_start_timeout_is_retried(capsys):
    ray = fake_ray([TIMEOUT])
    original = ray.init
    with retried_ray_start(ray):
        assert ray.init(num_cpus=2) == "context"
    assert ray.calls == [{"num_cpus": 2}] * 2 and ray.shutdowns == 1
    assert ray.init is original  # restored
    assert "starting it again (2 of 3)" in capsys.readouterr().err


def test_the_retries_are_bounded_and_other_errors_pass_through():
    ray = fake_ray([TIMEOUT] * 10)
    with retried_ray_start(ray), pytest.raises(Exception, match="timed out during startup"):
        ray.init()
    assert len(ray.calls) == RAY_START_TRIES and ray.shutdowns == RAY_START_TRIES - 1
    ray = fake_ray([ValueError("bad runtime_env")])
    with retried_ray_start(ray), pytest.raises(ValueError, match="bad runtime_env"):
        ray.init()
    assert len(ray.calls) == 1 and ray.shutdowns == 0


def test_verls_run_ppo_calls_ray_init_through_the_module_attribute():
    """The wrapper works because verl's main_ppo calls `ray.init(...)` on the module at call time."""
    import inspect

    import verl.trainer.main_ppo as main_ppo

    source = inspect.getsource(main_ppo.run_ppo)
    assert "ray.init(" in source and main_ppo.ray.__name__ == "ray"
