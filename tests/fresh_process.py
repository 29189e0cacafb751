"""Many fresh-process checks for the price of one interpreter start.

A check that needs a fresh process so that `import verl` (the plugin, `RPG_INSTALL`, the patches) starts clean is
`python -c CODE ARGS` with an environment; starting each one re-imports torch, transformers, Ray... (~8 s of CPU).
`run(cases)` starts ONE Python process that imports those third-party libraries (`PRELOAD`), never verl or rpg (it
checks that none of their modules is loaded), then forks one child per case: each child runs its code as
`python -c CODE ARGS` would (``__main__``, ``sys.argv``, its own environment, stdout and stderr, exit status), from
an import state where verl and rpg were never imported. The children run one after the other; each result is a
`subprocess.CompletedProcess`, so a test asserts on it as on `subprocess.run`'s. What Python reads at start-up
(``PYTHON*`` variables such as PYTHONWARNINGS, PYTHONPATH) is the test process's for every case: a case that sets one
is refused (run it with `subprocess.run`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Mapping, Sequence

# the third-party modules verl's own modules import (from `python -X importtime`), loaded once in the parent; a missing
# one is skipped. verl's own modules are a small part of an `import verl` (~10%): the rest is these.
PRELOAD = ("torch", "numpy", "tensordict", "transformers", "transformers.modeling_utils", "transformers.modeling_layers",
           "transformers.models.auto.auto_factory", "transformers.configuration_utils",
           "transformers.tokenization_utils_base", "datasets", "pandas", "pyarrow", "sympy", "ray",
           "ray.experimental.state.api", "ray.dag", "ray.util.collective", "fastapi", "uvicorn", "aiohttp", "peft",
           "peft.utils.save_and_load", "accelerate", "omegaconf", "hydra", "transfer_queue", "nvtx", "codetiming",
           "torchdata.stateful_dataloader")  # fmt: skip

RUNNER = r"""
import json, os, sys, traceback
for m in json.loads(sys.argv[1]):
    try:
        __import__(m)
    except ImportError:
        pass
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("verl", "rpg"))
assert not loaded, f"a preloaded library imported verl or rpg: {loaded}"
cases, tmp, results = json.load(sys.stdin), sys.argv[2], {}
for i, (name, code, args, env) in enumerate(cases):
    out, err = os.path.join(tmp, f"{i}.out"), os.path.join(tmp, f"{i}.err")
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: `python -c code *args` with `env`
        rc = 1
        try:
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = ["-c", *args]
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 0 if e.code is None else (print(e.code, file=sys.stderr), 1)[1]
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    results[name] = [os.waitstatus_to_exitcode(status), open(out).read(), open(err).read()]
print(json.dumps(results))
"""


def run(cases: Mapping[str, tuple[str, Sequence[str], Mapping[str, str]]], timeout: float = 900) -> dict[
        str, subprocess.CompletedProcess]:  # fmt: skip
    """{name: (code, args, environment)} -> {name: the CompletedProcess of `python -c code *args` in that environment,
    forked from one process that preloaded `PRELOAD`}. The runner's own failure is an AssertionError with its stderr."""
    for name, (_, _, env) in cases.items():  # read at interpreter start, i.e. the runner's (the test process's)
        start = {k: v for k, v in env.items() if k.startswith("PYTHON")}
        if start != {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}:
            raise ValueError(f"case {name!r} sets interpreter start-up variables (PYTHON*): run it with subprocess.run")
    payload = [[name, code, list(args), dict(env)] for name, (code, args, env) in cases.items()]
    with tempfile.TemporaryDirectory(prefix="rpg-fresh-") as tmp:
        proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(PRELOAD), tmp], input=json.dumps(payload),
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: subprocess.CompletedProcess([sys.executable, "-c", cases[name][0], *cases[name][1]], rc, out, err)
            for name, (rc, out, err) in results.items()}  # fmt: skip
