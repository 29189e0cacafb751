"""rpg/ray_start.py: the launcher's call of verl's run_ppo retries Ray's local start when the raylet misses Ray's
fixed 30 s (seen in fresh-clone test runs on a loaded machine), and only then; only for a CPU run: a GPU launch runs
Ray's own `ray.init` and `get_node`, the identical objects."""

from __future__ import annotations

import types

import pytest

from rpg.ray_start import RAY_START_TRIES, retried_ray_start

TIMEOUT = Exception(
    "The current node timed out during startup. This could happen because some of the raylet failed to startup or "
    "the GCS has become overloaded."
)


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


class FakeServices:
    """`ray._private.services` with a raylet that registers after `ready_after` seconds of a fake clock."""

    def __init__(self, ready_after: float):
        self.now, self.ready_after, self.polls = 0.0, ready_after, 0

    def get_node(self, gcs_address, node_id):
        self.polls += 1
        if self.now < self.ready_after:
            raise RuntimeError("RPC error: Deadline Exceeded")
        return {"node_id": node_id}

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_patient_start_waits_past_rays_30_s_and_no_longer_than_its_own_wait():
    from rpg.ray_start import patient_node_start

    services = FakeServices(ready_after=100.0)  # a raylet that needs 100 s: Ray alone gives up at 30 s
    original = services.get_node
    with patient_node_start(services, wait_s=150, clock=services.clock, sleep=services.sleep) as patched:
        assert patched and services.get_node("gcs", "n1") == {"node_id": "n1"}
    assert services.get_node == original and 100.0 <= services.now < 101.0  # restored; waited until registered
    services = FakeServices(ready_after=1e9)  # never registers: the poll fails after the wait, Ray's check decides
    with patient_node_start(services, wait_s=150, clock=services.clock, sleep=services.sleep):
        with pytest.raises(RuntimeError, match="Deadline Exceeded"):
            services.get_node("gcs", "n1")
        assert 150.0 < services.now <= 151.0
        with pytest.raises(RuntimeError):  # later polls count from the first one: no new 150 s each
            services.get_node("gcs", "n1")
        assert services.now <= 151.5


def test_ray_without_the_poll_is_left_alone():
    from rpg.ray_start import patient_node_start

    with patient_node_start(types.SimpleNamespace()) as patched:
        assert patched is False


def test_rays_node_start_polls_the_patched_function():
    """The patience works because Ray's Node polls `ray._private.services.get_node` through the module at call time,
    inside its fixed 30 s loop, and catches RuntimeError there."""
    import inspect

    import ray._private.node as node

    source = inspect.getsource(node.Node.__init__)
    assert "raylet_start_wait_time_s = 30" in source and "ray._private.services.get_node(" in source
    assert "except RuntimeError" in source


def test_the_launchers_start_is_patient_inside_init_only():
    services = types.SimpleNamespace(get_node=lambda *a: "node")
    original = services.get_node
    ray = fake_ray([])
    ray._private = types.SimpleNamespace(services=services)
    seen = []
    init = ray.init
    ray.init = lambda **kw: (seen.append(services.get_node is not original), init(**kw))[1]
    with retried_ray_start(ray):
        assert ray.init(num_cpus=1) == "context"
    assert seen == [True] and services.get_node is original


@pytest.mark.parametrize("profile, patient", [("gpu", False), ("cpu", True)])
def test_only_a_cpu_run_changes_rays_start(profile, patient):
    """The launcher's start (`rpg.launch.run`: `for_run(cpu=not is_gpu_run(config))`) on the composed config of
    each profile: a GPU launch sees Ray's own `ray.init` and `get_node` inside it, a CPU run the patient ones."""
    import ray
    import ray._private.services as services

    from rpg.launch import compose_config, is_gpu_run
    from rpg.ray_start import for_run

    config = compose_config([f"profile={profile}"])
    init, get_node = ray.init, services.get_node
    with for_run(cpu=not is_gpu_run(config)):
        assert (ray.init is not init) is patient
        assert services.get_node is get_node  # outside ray.init, even a CPU run polls Ray's own
    assert ray.init is init and services.get_node is get_node


def test_the_launcher_starts_ray_through_for_run_with_the_configs_device():
    import inspect

    import rpg.launch

    source = inspect.getsource(rpg.launch.run)
    assert "with ray_start.for_run(cpu=not is_gpu_run(config)):" in source and "run_ppo(" in source
