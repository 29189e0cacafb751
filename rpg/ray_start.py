"""Ray's local start on a loaded machine: a longer wait for the raylet, then a restart if even that is missed.

`ray.init()` without an address (and `ray start`) starts a local node and waits a hard-coded 30 s for its raylet to
register with the GCS (ray/_private/node.py: `raylet_start_wait_time_s = 30`), polling
`ray._private.services.get_node`; past 30 s it raises "The current node timed out during startup". On a machine whose
cores are busy (several runs starting at once, a 2-core CI machine) a healthy start can take longer: one poll alone
waited 43 s on the GCS ("RPC error: Deadline Exceeded"). Two remedies, both only around the start:

* `patient_node_start()` makes that poll patient: a poll that fails is retried inside it until RAY_START_WAIT_S
  have passed since the first one, so Ray's own 30 s check sees a failure only after that (Ray's loop and message are
  unchanged; only the wait grows). Applied when `ray._private.services.get_node` exists (Ray 2.60, pinned by verl's
  environment); without it, nothing is patched.
* `retried_ray_start()` wraps `ray.init` for the launcher's call of verl's `run_ppo`: inside it the wait is patient,
  and a start that still times out is shut down and tried again (RAY_START_TRIES in all), saying so; any other error
  is raised as it is.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator

RAY_START_TRIES = 3
RAY_START_WAIT_S = 150.0  # the raylet's registration wait, against Ray's fixed 30 s
TIMED_OUT = "timed out during startup"  # Ray's message when the raylet misses its wait


@contextlib.contextmanager
def patient_node_start(services=None, wait_s: float = RAY_START_WAIT_S, clock=time.monotonic,
                       sleep=time.sleep) -> Iterator[bool]:  # fmt: skip
    """Within the block, `services.get_node` (default: `ray._private.services`) retries a RuntimeError until `wait_s`
    seconds after its first call in the block; yields whether anything was patched."""
    if services is None:
        try:
            from ray._private import services
        except ImportError:  # another Ray layout: Ray's own 30 s stay
            services = None
    original = getattr(services, "get_node", None)
    if original is None:
        yield False
        return
    first: list[float] = []  # the time of the first poll in the block

    def get_node(*args, **kwargs):
        if not first:
            first.append(clock())
        while True:
            try:
                return original(*args, **kwargs)
            except RuntimeError:  # not registered yet, or the GCS did not answer in time
                if clock() - first[0] > wait_s:
                    raise
                sleep(0.5)

    services.get_node = get_node
    try:
        yield True
    finally:
        services.get_node = original


@contextlib.contextmanager
def retried_ray_start(ray_module=None, tries: int = RAY_START_TRIES, wait_s: float = RAY_START_WAIT_S) -> Iterator[None]:
    if ray_module is None:
        import ray as ray_module
    original = ray_module.init
    services = getattr(getattr(ray_module, "_private", None), "services", None)

    def init(*args, **kwargs):
        for attempt in range(1, tries + 1):
            try:
                with patient_node_start(services, wait_s):
                    return original(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 -- Ray raises a bare Exception for this one
                if TIMED_OUT not in str(e) or attempt == tries:
                    raise
                print(f"[rpg] Ray's local start timed out (its raylet did not register in {wait_s:.0f} s; the "
                      f"machine is busy); starting it again ({attempt + 1} of {tries})", file=sys.stderr)  # fmt: skip
                ray_module.shutdown()

    ray_module.init = init
    try:
        yield
    finally:
        ray_module.init = original
