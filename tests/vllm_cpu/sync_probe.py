"""Test-only probe of verl's vLLM weight sync: logs every sync, and can drop all but the first (negative control).

Named in ``VERL_USE_EXTERNAL_MODULES`` (with this folder on ``PYTHONPATH``), it re-registers verl's ``("vllm",
"async")`` rollout as `ProbeServerAdapter`: verl's own ``ServerAdapter``, whose ``update_weights`` first prints
``[sync_probe] weights <- step N`` (one line per sync on the console), then

* forwards the weights to the engine, as verl does, and prints ``[sync_probe] step N: weights sum S`` (the float64 sum
  of every pushed tensor: a fingerprint that tells which parameter set was pushed, e.g. schedule-free's x or y, where
  the rollout−actor gap cannot, as in bf16); or, with ``RPG_TEST_SYNC=first-only``,
* forwards only the first call of each actor worker (at start-up: verl starts vLLM with ``load_format=dummy``, so
  that call is what loads the policy at all) and drains and drops every later one (``[sync_probe] dropped ...``).
  The rollout then samples from a stale policy, and ``training/rollout_probs_diff_mean`` must grow: the negative
  control showing that the metric the vLLM tests rely on sees a missing sync.

The class is built on first use (module ``__getattr__``, which verl's ``get_rollout_class`` goes through), so
importing this module in processes that never build a rollout does not import vLLM.
"""

import math
import os

from verl.workers.rollout.base import _ROLLOUT_REGISTRY

_CLASS = "ProbeServerAdapter"


def _build():
    from verl.workers.rollout.vllm_rollout import ServerAdapter

    first_only = os.environ.get("RPG_TEST_SYNC", "all") == "first-only"

    class ProbeServerAdapter(ServerAdapter):
        _calls = 0

        async def update_weights(self, weights, global_steps=None, **kwargs):
            ProbeServerAdapter._calls += 1
            print(f"[sync_probe] weights <- step {global_steps}", flush=True)
            if first_only and ProbeServerAdapter._calls > 1:
                for _ in weights:  # drain: on several ranks each tensor is gathered collectively
                    pass
                print(f"[sync_probe] dropped the weights of step {global_steps}", flush=True)
                return None
            if kwargs.get("wire_format", "named_tensors") != "named_tensors":  # delta payloads: not tensors to sum
                return await super().update_weights(weights, global_steps=global_steps, **kwargs)
            sums = []
            result = await super().update_weights(_summed(weights, sums), global_steps=global_steps, **kwargs)
            print(f"[sync_probe] step {global_steps}: weights sum {math.fsum(sums)!r}", flush=True)
            return result

    ProbeServerAdapter.__module__ = __name__
    return ProbeServerAdapter


def _summed(weights, sums: list):
    """Yields `weights` ((name, tensor) pairs) unchanged, appending each tensor's float64 sum to `sums`."""
    for name, tensor in weights:
        sums.append(tensor.detach().double().sum().item())
        yield name, tensor


def __getattr__(name):
    if name == _CLASS:
        globals()[name] = cls = _build()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_ROLLOUT_REGISTRY[("vllm", "async")] = f"{__name__}.{_CLASS}"
