"""Several nodes that save: `CKPTS_DIR` must be one folder every node sees (docs/gpu.md#several-nodes).

verl 0.9.1's checkpoint is written from several places: every rank writes its own FSDP shard files, the TaskRunner
(placed by Ray on any node) writes `latest_checkpointed_iteration.txt`, and rank 0 writes the periodic reference's
state (`rpg_reference/`). On resume every rank reads its shard and the TaskRunner reads the tracker file. On disks
local to each node a resumed run silently starts from step 0 (`resume_mode: auto` finds no tracker file on its node)
or crashes on a missing shard. So a run with `trainer.nnodes > 1` that saves (`trainer.save_freq > 0`) or resumes
from a path checks, before verl's trainer starts, that the folder is shared: a sentinel file with a random token is
written under `trainer.default_local_dir` by a Ray task pinned to one node and read back by a task pinned to every
other node (`NodeAffinitySchedulingStrategy`, hard); then removed. A node that does not read the token refuses the
launch, naming the nodes, what each saw, the reason and the fix.

Where it runs: in the Ray driver, right after verl's `run_ppo` has connected to (or started) Ray and before it starts
the TaskRunner (`CheckedTaskRunner` wraps the TaskRunner class `run_ppo` is given: its `.remote()` runs the check
first). So it sees the same cluster, runtime environment and working directory as verl's workers, for a local launch
and for a Ray job alike, and costs one round of tiny tasks. The nodes checked are every alive node with a CPU or a
GPU, for a GPU run too: the workers go to GPU nodes, but the TaskRunner (`num_cpus=1`, no GPU) that writes the step
tracker may be placed on a CPU-only head node.

`shared_dir_problem` is the logic (the nodes, a writer and a reader given as functions: tested with a fake); `check`
is the Ray side.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any, Callable, Optional, Sequence

from rpg.preflight.compose import RecipeConfigError

SENTINEL_PREFIX = ".rpg-shared-check-"
CHECK_TIMEOUT_S = 300.0


def needs_check(config: Any) -> bool:
    """Several nodes, and a checkpoint written (save_freq > 0) or read from a path (resume_mode=resume_path)."""
    trainer = config.trainer
    saves = int(trainer.get("save_freq", -1) or -1) > 0
    resumes = str(trainer.get("resume_mode", "auto")) == "resume_path"
    return int(trainer.nnodes) > 1 and (saves or resumes)


def shared_dir_problem(
    path: str,
    nodes: Sequence[str],
    write: Callable[[str, str, str, str], str],
    read: Callable[[str, str, str], str],
    remove: Callable[[str, str, str], None],
) -> Optional[str]:
    """Write a token on `nodes[0]`, read it on every other node; the refusal's text, or None when all read it.

    `write(node, path, name, token)` returns where the file went (the absolute path seen on that node);
    `read(node, path, name)` returns the file's text or raises; `remove(node, path, name)` deletes the sentinel."""
    if len(nodes) < 2:
        return None
    token, name = uuid.uuid4().hex, SENTINEL_PREFIX + uuid.uuid4().hex[:12]
    writer = nodes[0]
    where = write(writer, path, name, token)
    try:
        seen = {}
        for node in nodes[1:]:
            try:
                text = read(node, path, name)
                seen[node] = "the same file" if text == token else f"another file (content {text[:40]!r})"
            except FileNotFoundError:
                seen[node] = "no such file"
            except Exception as e:  # noqa: BLE001 - permission denied, a stale mount, ...
                seen[node] = f"{type(e).__name__}: {e}"
    finally:
        remove(writer, path, name)
    missed = {node: what for node, what in seen.items() if what != "the same file"}
    if not missed:
        return None
    return (
        f"trainer.default_local_dir={path!r} (recipe knob CKPTS_DIR) is not shared by the {len(nodes)} nodes of this "
        f"run (trainer.nnodes > 1 with checkpoints saved or resumed): a file written there on node {writer[:12]} "
        f"({where}) was not found by " + "; ".join(f"node {n[:12]}: {w}" for n, w in missed.items()) + ". verl writes "
        f"each rank's shard on its own node and the step tracker (latest_checkpointed_iteration.txt) on whichever "
        f"node holds the TaskRunner, and reads them all back on resume: on node-local disks a resumed run starts "
        f"from step 0 or fails on a missing shard. Fix: set CKPTS_DIR to a folder on a filesystem every node mounts "
        f"at the same path (NFS, Lustre, GPFS, ...; an absolute path), or run on one node (NNODES=1), or save no "
        f"checkpoint (trainer.save_freq=-1)"
    )


# ---------------------------------------------------------------------------------------------------------------
# Ray side
# ---------------------------------------------------------------------------------------------------------------
def _write_sentinel(path: str, name: str, token: str) -> str:
    os.makedirs(path, exist_ok=True)
    target = os.path.join(os.path.abspath(path), name)
    with open(target, "x") as f:  # a new file of ours: never one of the user's
        f.write(token)
    return f"{target} on {socket.gethostname()}"


def _read_sentinel(path: str, name: str) -> str:
    with open(os.path.join(path, name)) as f:
        return f.read()


def _remove_sentinel(path: str, name: str) -> None:
    try:
        os.remove(os.path.join(path, name))
    except FileNotFoundError:
        pass


def run_nodes(nodes: Optional[Sequence[dict]] = None) -> list[str]:
    """The alive Ray nodes (default `ray.nodes()`) that can hold a part of the run: a worker (a GPU or, on the CPU
    profile, a CPU) or the TaskRunner (a CPU), so every node with a CPU or a GPU, a CPU-only head included."""
    if nodes is None:
        import ray

        nodes = ray.nodes()

    def usable(node: dict) -> bool:
        return node.get("Alive") and any(node.get("Resources", {}).get(r, 0) > 0 for r in ("CPU", "GPU"))

    return sorted(n["NodeID"] for n in nodes if usable(n))


def _on(node: str, fn: Callable, *args: Any) -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    return ray.get(task.options(scheduling_strategy=strategy).remote(*args), timeout=CHECK_TIMEOUT_S)


def check(config: Any, nodes: Optional[Sequence[str]] = None) -> Optional[str]:
    """Run the sentinel check on the connected Ray cluster's nodes (default `run_nodes`); the refusal or None."""
    from ray.exceptions import RayTaskError

    def read(node: str, path: str, name: str) -> str:
        try:
            return _on(node, _read_sentinel, path, name)
        except RayTaskError as e:  # the task's own exception (FileNotFoundError, PermissionError, ...)
            raise e.as_instanceof_cause() from None

    nodes = list(nodes) if nodes is not None else run_nodes()
    path = str(config.trainer.default_local_dir)
    return shared_dir_problem(
        path,
        nodes,
        write=lambda node, p, name, token: _on(node, _write_sentinel, p, name, token),
        read=read,
        remove=lambda node, p, name: _on(node, _remove_sentinel, p, name),
    )


class CheckedTaskRunner:
    """Stands for a TaskRunner class in `verl.trainer.main_ppo.run_ppo(config, task_runner_class=...)`: Ray is up
    when `run_ppo` calls `.remote()` (or `.options(...)`), so the check runs there, before the TaskRunner starts."""

    def __init__(self, runner_class: Any, config: Any):
        self.runner_class, self.config = runner_class, config

    def _check(self) -> None:
        print(
            f"[rpg] checking that trainer.default_local_dir={self.config.trainer.default_local_dir} is shared by "
            f"the run's nodes (trainer.nnodes={self.config.trainer.nnodes})",
            flush=True,
        )
        problem = check(self.config)
        if problem:
            raise RecipeConfigError(problem)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self.runner_class.remote(*args, **kwargs)

    def options(self, **kwargs: Any) -> Any:
        self._check()
        return self.runner_class.options(**kwargs)
