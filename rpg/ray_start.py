"""Ray's local start, retried when its raylet misses Ray's fixed start-up limit (a loaded machine).

`ray.init()` without an address starts a local cluster and waits a hard-coded 30 s for the raylet to register with
the GCS (ray/_private/node.py: `raylet_start_wait_time_s = 30`), then raises "The current node timed out during
startup". On a machine whose cores are busy (several runs starting at once, a CPU test machine) that start can take
longer while nothing is wrong. `retried_ray_start()` wraps `ray.init` for the launcher's call of verl's `run_ppo`: that
one error shuts the partial start down and tries again (RAY_START_TRIES in all), saying so; any other error is raised
as it is.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

RAY_START_TRIES = 3
TIMED_OUT = "timed out during startup"  # Ray's message when the raylet misses its 30 s


@contextlib.contextmanager
def retried_ray_start(ray_module=None, tries: int = RAY_START_TRIES) -> Iterator[None]:
    if ray_module is None:
        import ray as ray_module
    original = ray_module.init

    def init(*args, **kwargs):
        for attempt in range(1, tries + 1):
            try:
                return original(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 -- Ray raises a bare Exception for this one
                if TIMED_OUT not in str(e) or attempt == tries:
                    raise
                print(f"[rpg] Ray's local start timed out (its raylet has a fixed 30 s to register; the machine is "
                      f"busy); starting it again ({attempt + 1} of {tries})", file=sys.stderr)  # fmt: skip
                ray_module.shutdown()

    ray_module.init = init
    try:
        yield
    finally:
        ray_module.init = original
