"""Ray's local start on a loaded machine (a CPU run: the CPU profile and the tests): a longer wait for the raylet,
then a restart if even that is missed. A GPU launch runs Ray's own `ray.init`, untouched (`for_run`).

`ray.init()` without an address (and `ray start`) starts a local node and waits a hard-coded 30 s for its raylet to
register with the GCS (ray/_private/node.py: `raylet_start_wait_time_s = 30`), polling
`ray._private.services.get_node`; past 30 s it raises "The current node timed out during startup". On a machine whose
cores are busy (several runs starting at once, a 2-core CI machine) a healthy start can take longer: one poll alone
waited 43 s on the GCS ("RPC error: Deadline Exceeded"). Two remedies, both only around the start:

* `patient_node_start()` makes that poll patient: a poll that fails is retried inside it until RAY_START_WAIT_S
  have passed since the first one, so Ray's own 30 s check sees a failure only after that (Ray's loop and message are
  unchanged; only the wait grows). Applied when `ray._private.services.get_node` exists (Ray 2.60, pinned by verl's
  environment); without it, nothing is patched.
* `retried_ray_start()` wraps `ray.init` for the launcher's call of verl's `run_ppo` in a CPU run (`for_run`): inside
  it the wait is patient, and a start that still times out is shut down and tried again (RAY_START_TRIES in all),
  saying so; any other error is raised as it is.

Both patch Ray's objects (a private one among them) for the duration of a block only, and only where the machine is
known to be shared and slow: a CPU run, whose cores the trainer's own processes and the tests share. A GPU node starts
its raylet in seconds; there Ray's own wait and message stand.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, ContextManager, Iterator

RAY_START_TRIES = 3
RAY_START_WAIT_S = 150.0  # the raylet's registration wait, against Ray's fixed 30 s
TIMED_OUT = "timed out during startup"  # Ray's message when the raylet misses its wait


@contextlib.contextmanager
def patient_node_start(
    services: Any = None,
    wait_s: float = RAY_START_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bool]:
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


def _retry_message(wait_s: float, attempt: int, tries: int) -> str:
    return (f"[rpg] Ray's local start timed out (its raylet did not register in {wait_s:.0f} s; the machine is busy); "
            f"starting it again ({attempt} of {tries})")


@contextlib.contextmanager
def retried_ray_start(
    ray_module: Any = None, tries: int = RAY_START_TRIES, wait_s: float = RAY_START_WAIT_S
) -> Iterator[None]:
    """Within the block, `ray_module.init` (default: `ray`) starts patiently and retries a start that timed out."""
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
                print(_retry_message(wait_s, attempt + 1, tries), file=sys.stderr)
                ray_module.shutdown()

    ray_module.init = init
    try:
        yield
    finally:
        ray_module.init = original


def for_run(cpu: bool) -> ContextManager:
    """The Ray start of the launcher's `run_ppo`: `retried_ray_start()` for a CPU run (``trainer.device=cpu``, the CPU
    profile), else nothing: a GPU launch calls Ray's own `ray.init` and polls Ray's own `get_node`."""
    return retried_ray_start() if cpu else contextlib.nullcontext()
