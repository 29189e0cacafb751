"""N gloo ranks for in-process engine tests: N spawned processes that run test functions together (test helper).

verl's FSDP2 engine with N data-parallel ranks needs N processes in one torch.distributed process group. `RankPool`
spawns them once (each imports torch/verl once, joins one gloo group on 127.0.0.1 with a free port, and installs the
CPU platform), then runs any number of *scenarios*: a module-level function ``fn(rank, world_size, **kwargs)``
executed on every rank at the same time (so its collectives meet), whose per-rank return values come back as a
list. A failure on any rank raises here with that rank's traceback; a scenario that outlives its timeout terminates
the pool's own processes (by pid) and fails the test.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import socket
import sys
import traceback
from typing import Any

_ENV = {
    "VERL_PLATFORM": "cpu",  # rpg.cpu.platform: gloo, no pinned memory
    "VERL_ENGINE_DEVICE": "cuda",  # selects verl's FSDP engine (registered for cuda/npu); the device is "cpu"
    "OMP_NUM_THREADS": "1",
    "TORCH_COMPILE_DISABLE": "1",
    "TORCHINDUCTOR_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "MASTER_ADDR": "127.0.0.1",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, sys_path: list[str], conn) -> None:
    sys.path[:] = sys_path
    os.environ.update(_ENV, WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_PORT=str(port))
    try:  # imports after the environment above: the CPU platform registers itself before verl is imported
        import torch.distributed as dist

        from rpg.cpu import platform as cpu_platform

        cpu_platform.install()
        import rpg.cpu.hf_rollout  # noqa: F401  (rollout.name=hf: the fused worker builds a rollout adapter)
        import rpg.verl_plugin  # noqa: F401  (RPG losses + the reference adapter and hooks)

        dist.init_process_group("gloo", rank=rank, world_size=world_size)  # verl's workers reuse it
        conn.send(("ready", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        message = conn.recv()
        if message is None:
            break
        module, name, kwargs = message
        try:
            result = getattr(importlib.import_module(module), name)(rank, world_size, **kwargs)
            conn.send(("ok", result))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    dist.destroy_process_group()


class RankPool:
    """`world_size` spawned ranks in one gloo group; `run(fn, **kwargs)` runs ``fn`` on all of them."""

    def __init__(self, world_size: int = 2, start_timeout_s: float = 300):
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.conns, self.procs = [], []
        port = _free_port()
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(rank, world_size, port, list(sys.path), child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        self._collect("start-up", start_timeout_s)

    def _collect(self, what: str, timeout_s: float) -> list[Any]:
        results, errors = [], []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(timeout_s):
                self.close(force=True)
                raise TimeoutError(f"rank {rank}: no answer to {what} within {timeout_s} s (pool terminated)")
            status, payload = conn.recv()
            if status == "error":
                errors.append(f"--- rank {rank} ---\n{payload}")
            results.append(payload)
        if errors:
            raise RuntimeError(f"{what} failed on {len(errors)} rank(s):\n" + "\n".join(errors))
        return results

    def run(self, fn, timeout_s: float = 600, **kwargs) -> list[Any]:
        """Run the module-level function ``fn(rank, world_size, **kwargs)`` on every rank; its results by rank."""
        for conn in self.conns:
            conn.send((fn.__module__, fn.__name__, kwargs))
        return self._collect(fn.__name__, timeout_s)

    def close(self, force: bool = False) -> None:
        for conn, proc in zip(self.conns, self.procs):
            if not force and proc.is_alive():
                try:
                    conn.send(None)
                except OSError:
                    pass
        for proc in self.procs:
            proc.join(timeout=0 if force else 30)
            if proc.is_alive():
                proc.terminate()  # our own child, by pid
                proc.join(timeout=10)
