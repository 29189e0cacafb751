"""A real, private Ray head on 127.0.0.1 for the cluster submission of tests/e2e/test_e2e_trainer_on_cpu.py (test helper).

`ray start --head --block` in its own session, with its own temp dir (short, for Ray's unix sockets) and its own free
ports (GCS, dashboard/job API, client server, node/object managers, agents, metrics, worker range), started from the
project's virtualenv the way a user starts a head node (`.venv/bin` first on PATH, so the job's `python3` and Ray's
workers are the environment with rpg-verl installed). Ray's token authentication is on, with a token of its own in the
temp dir (`client_env` is what a client needs to talk to it): Ray 2.60's `ray start --head` turns token
authentication on by itself whenever ~/.ray/auth_token exists (any earlier local `ray.init()` writes it), so the
head must not depend on that file. Stopping it never touches another Ray: it terminates the
`ray start` process and every process descended from it (GCS, raylet, dashboard, the job supervisor and the job's own
processes), found by pid, plus any process with this head's temp dir on its command line; SIGTERM, then SIGKILL.
`ray stop` is never used (it kills every Ray on the machine). The head is up once `ray start` says "Ray runtime
started." and its job API answers (the API answers first: a loaded machine once saw the head's raylet miss Ray's fixed
30 s afterwards, and `ray start` tear the head down). `ray start` runs with the launcher's patient raylet wait
(rpg/ray_start.py: 150 s instead of Ray's 30 s); a start that still times out is retried, 3 tries.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil


# Ray's CLI (the `ray` console script's `ray.scripts.scripts:main`) with the patient raylet wait
RAY_CLI = ("import sys; from rpg.ray_start import patient_node_start; from ray.scripts.scripts import main\n"
           "sys.argv[0] = 'ray'\nwith patient_node_start():\n    main()")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalRayHead:
    """Start with `LocalRayHead(num_cpus, num_gpus)`; `address` is the job API (http://127.0.0.1:<port>), `client_env`
    the environment a client adds to reach it (None: remove the variable)."""

    STARTUP_TIMEOUT = "The current node timed out during startup"  # Ray's fixed 30 s for the raylet (rpg/ray_start.py)

    def __init__(self, num_cpus: int = 16, num_gpus: int = 1, timeout_s: float = 120, tries: int = 3):
        for attempt in range(1, tries + 1):  # a loaded machine: Ray's own start may miss its fixed 30 s
            if self._start(num_cpus, num_gpus, timeout_s):
                return
            print(f"[local_ray_head] ray start timed out during its startup (try {attempt} of {tries})", flush=True)
        raise RuntimeError(f"ray start timed out during startup {tries} times:\n{self.start_log[-3000:]}")

    def _start(self, num_cpus: int, num_gpus: int, timeout_s: float) -> bool:
        """One `ray start`; True once it says "Ray runtime started." and its job API answers; False (stopped) when
        Ray's startup timed out; any other failure raises."""
        self.temp_dir = tempfile.mkdtemp(prefix="rpgray-", dir="/tmp")
        gcs, dash, client, node, obj, agent_http, agent_grpc, runtime_agent, metrics = _free_ports(9)
        # workers' ports: a window of 200 between Ray's default range (10002-19999, used by every other local Ray)
        # and Linux's ephemeral ports (32768+, where the free ports above come from); Ray refuses overlaps
        taken = {gcs, dash, client, node, obj, agent_http, agent_grpc, runtime_agent, metrics}
        windows = [20000 + 200 * ((os.getpid() + i) % 60) for i in range(60)]
        low = next(w for w in windows if not taken & set(range(w, w + 200)))
        self.address = f"http://127.0.0.1:{dash}"
        self.gcs_address = f"127.0.0.1:{gcs}"
        bin_dir = str(Path(sys.executable).parent)
        token_path = os.path.join(self.temp_dir, "auth_token")
        with open(token_path, "w") as f:
            f.write(secrets.token_hex(32))
        self.client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path, "RAY_AUTH_TOKEN": None}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH_", "VERL_", "RPG_"))}
        env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
                   RAY_AUTH_TOKEN_PATH=token_path, PYTHONUNBUFFERED="1")  # fmt: skip  (its log is read while it runs)
        cmd = [  # `ray start`, with the raylet's registration wait of the launcher's own start (rpg/ray_start.py)
            sys.executable, "-c", RAY_CLI, "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address=127.0.0.1", f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}", f"--ray-client-server-port={client}", f"--node-manager-port={node}",
            f"--object-manager-port={obj}", f"--dashboard-agent-listen-port={agent_http}",
            f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime_agent}",
            f"--metrics-export-port={metrics}", f"--min-worker-port={low}", f"--max-worker-port={low + 199}",
            f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}", f"--temp-dir={self.temp_dir}",
        ]  # fmt: skip
        self.log = open(os.path.join(self.temp_dir, "ray-start.log"), "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:  # the job API answers before the raylet is up: wait for both
            if self.proc.poll() is not None:
                self.stop()
                if self.STARTUP_TIMEOUT in self.start_log:
                    return False
                raise RuntimeError(f"ray start exited with {self.proc.returncode}:\n{self.start_log[-3000:]}")
            with open(self.log.name, errors="replace") as f:
                started = "Ray runtime started." in f.read()
            try:
                urllib.request.urlopen(f"{self.address}/api/version", timeout=2).close()
                answering = True
            except urllib.error.HTTPError:  # answering (e.g. 401 when Ray's token authentication is on): up
                answering = True
            except OSError:
                answering = False
            if started and answering:
                return True
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"the Ray head's job API at {self.address} did not answer within {timeout_s} s:\n"
                           f"{self.start_log[-3000:]}")

    def processes(self) -> list[psutil.Process]:
        """The `ray start` process, all its descendants, and any process of this head's session that left the tree
        (found by this head's own temp dir on its command line)."""
        procs: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.proc.pid)
            procs.update((p.pid, p) for p in [root, *root.children(recursive=True)])
        except psutil.NoSuchProcess:
            pass
        for p in psutil.process_iter(["cmdline"]):
            if p.pid not in procs and self.temp_dir in " ".join(p.info["cmdline"] or []):
                procs[p.pid] = p
        return list(procs.values())

    def stop(self, keep_logs: Path | None = None) -> list[psutil.Process]:
        """Terminate this head's processes (SIGTERM, then SIGKILL after 5 s); copy Ray's session logs to `keep_logs`
        (if given: what a failed run is diagnosed from, e.g. a dashboard that died under load); remove its temp dir.
        Returns the processes still alive afterwards (none expected)."""
        procs = self.processes()
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)  # some of Ray's processes sit out SIGTERM: do not wait long
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        _, survivors = psutil.wait_procs(alive, timeout=10)
        if not self.log.closed:
            self.log.close()
            with open(self.log.name, errors="replace") as f:
                self.start_log = f.read()
        logs = Path(self.temp_dir) / "session_latest" / "logs"
        if keep_logs is not None and logs.is_dir():
            shutil.copytree(logs, keep_logs, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock"))
            shutil.copy(self.log.name, keep_logs)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return survivors
