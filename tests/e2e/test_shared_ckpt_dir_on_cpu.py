"""The multi-node CKPTS_DIR check on a real two-node Ray cluster on one machine (rpg/preflight/shared_ckpt.py;
docs/gpu.md#several-nodes): a private head (local_ray_head.py) and a second node joined with `ray start --address`
(its own ports and temp dir), so the folder is shared (one filesystem). The check's sentinel is written by a task
pinned to one node and read by a task pinned to the other; no trainer starts. The not-shared case is the fake of
tests/preflight/test_shared_ckpt_on_cpu.py (one machine cannot have two disks under one path)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.trainer  # a Ray cluster of two nodes: its own job, one start-up at a time (scripts/test.sh)

BIN = Path(sys.executable).parent
DRIVER = r"""
import json, os, sys, time
import ray
from omegaconf import OmegaConf
from rpg.preflight import shared_ckpt as S

ray.init(address=sys.argv[1], logging_level="ERROR")
deadline = time.time() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
    time.sleep(1)
if len([n for n in ray.nodes() if n["Alive"]]) < 2:
    sys.exit(f"the second node did not join: {[(n['NodeID'][:8], n['Alive'], n.get('Resources')) for n in ray.nodes()]}")

def where():
    import ray
    return ray.get_runtime_context().get_node_id()

cfg = OmegaConf.create({"trainer": {"nnodes": 2, "device": "cpu", "default_local_dir": sys.argv[2], "save_freq": 20}})
nodes = S.run_nodes()
print(json.dumps({"nodes": nodes, "ran_on": [S._on(n, where) for n in nodes], "needs": S.needs_check(cfg),
                  "problem": S.check(cfg), "left": sorted(os.listdir(sys.argv[2]))}))
"""


def _join(head, free_ports) -> subprocess.Popen:
    """`ray start --address <head> --block` for a second node on this machine: own ports and temp dir."""
    node, obj, agent_http, agent_grpc, runtime_agent, metrics = free_ports(6)
    low = 20000 + 200 * ((os.getpid() + 30) % 60)
    cmd = [
        str(BIN / "ray"), "start", f"--address={head.gcs_address}", "--block", "--disable-usage-stats",
        "--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0", f"--node-manager-port={node}",
        f"--object-manager-port={obj}", f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime_agent}",
        f"--metrics-export-port={metrics}", f"--min-worker-port={low}", f"--max-worker-port={low + 199}",
        f"--temp-dir={head.temp_dir}/n2",  # its own session and sockets; inside the head's: head.stop() cleans it too
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH_", "VERL_", "RPG_"))}
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", RAY_USAGE_STATS_ENABLED="0",
               **{k: v for k, v in head.client_env.items() if v is not None})  # fmt: skip
    log = open(os.path.join(head.temp_dir, "node2.log"), "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """This node's `ray start` process and its descendants only (SIGTERM, then SIGKILL)."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def test_a_shared_ckpts_dir_passes_the_check_on_two_nodes(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from local_ray_head import LocalRayHead, _free_ports

    head = LocalRayHead(num_cpus=1, num_gpus=0)
    second = None
    try:
        second = _join(head, _free_ports)
        ckpts = tmp_path / "ckpts"
        env = {k: v for k, v in {**os.environ, **head.client_env}.items() if v is not None and k != "RAY_ADDRESS"}
        env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
        out = subprocess.run([sys.executable, "-c", DRIVER, head.gcs_address, str(ckpts)], capture_output=True,
                             text=True, env=env, timeout=300)  # fmt: skip
        with open(os.path.join(head.temp_dir, "node2.log"), errors="replace") as f:
            node2_log = f.read()
        assert out.returncode == 0, out.stderr[-3000:] + "\nsecond node's ray start:\n" + node2_log[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        if second is not None:
            _stop(second)
        survivors = head.stop()
    assert not survivors, f"processes of the test's Ray head survived SIGKILL: {survivors}"
    assert len(result["nodes"]) == 2 and result["ran_on"] == result["nodes"]  # each task ran on its own node
    assert result["needs"] and result["problem"] is None  # one filesystem: shared
    assert result["left"] == []  # the sentinel is removed; the folder (made by the check) stays empty
