"""Submit a recipe's command to the Ray cluster at RAY_ADDRESS with Ray's job-submission SDK.

Run by `rpg.preflight.recipe_argv` (standard library; `ray` is imported when a job is submitted). The repository is
uploaded as the job's working directory (without virtualenvs, data and outputs) and the `rpg` package as a py_module to every
node; the job receives the launcher's environment (`FORWARDED_ENV`), the profile's `RPG_PROFILE_JOB_ENV` (the CPU
profile's platform settings) and the user's `RPG_JOB_ENV` (space-separated names; those unset here are skipped).
It prints the submission id and the commands to follow, query and stop the job, then, by default, follows it: the logs
stream here and the exit status is the job's (0 if it SUCCEEDED, 1 otherwise; Ctrl-C stops following, not the job).
`RPG_RAY_FOLLOW=0` returns right after the submission. `RPG_RAY_JOB_ID` sets the submission id (default
rpg-<experiment>-<UTC time>-<random>; Ray refuses an id that the cluster already has). A cluster with Ray's token
authentication is reached as Ray's own CLI reaches it (RAY_AUTH_MODE=token and the token in the environment).
"""

from __future__ import annotations

import asyncio
import random
import re
import shlex
import sys
import time
from typing import Dict, List, Sequence

EXCLUDES = [".venv*", ".git", "data", "ckpts", "outputs", "wandb", "artifacts", "*.parquet"]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SubmitError(ValueError):
    """A Ray submission that cannot start (the message names the setting and the fix)."""


def job_env_names(value: str) -> List[str]:
    """The names of RPG_JOB_ENV (space-separated), each checked."""
    names = value.split()
    for n in names:
        if not _NAME.fullmatch(n):
            raise SubmitError(
                f"RPG_JOB_ENV='{value}': '{n}' is not an environment variable name; give names separated by spaces "
                f'(e.g. RPG_JOB_ENV="HF_HOME WANDB_API_KEY")'
            )
    return names


def follow_setting(env: Dict[str, str]) -> bool:
    follow = env.get("RPG_RAY_FOLLOW", "1")
    if follow not in ("0", "1"):
        raise SubmitError(f"RPG_RAY_FOLLOW='{follow}' is not valid; choose one of: 0 1")
    return follow == "1"


def runtime_env(env: Dict[str, str], repo: str, names: Sequence[str]) -> dict:
    env_vars = {n: env[n] for n in dict.fromkeys(names) if n in env}
    return {"working_dir": repo, "env_vars": env_vars, "py_modules": [f"{repo}/rpg"], "excludes": list(EXCLUDES)}


def default_job_id(exp_name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", exp_name)
    return f"rpg-{safe}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{random.randint(0, 32767)}"


CONNECT_WAIT_S = 30.0  # how long a submission waits for a cluster's job API to answer at all
AGENT_WAIT_S = 120.0  # how long a submission waits for a cluster's job agent (a head that has just started)
NO_AGENT = "No available agent"  # Ray's HTTP 500 answer until the head's dashboard agent is up


def _client(address: str):
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError as e:
        raise SubmitError(
            f"RAY_ADDRESS='{address}' submits with Ray's job-submission SDK, but `ray` cannot be imported by "
            f"{sys.executable} ({e}); activate the environment where rpg-verl is installed (e.g. source "
            f".venv/bin/activate) or set PYTHON to its interpreter, or unset RAY_ADDRESS to run locally"
        ) from None
    waited = 0.0
    while True:  # a head that has just started (or is busy) may not answer yet: CONNECT_WAIT_S, then Ray's error
        try:
            return JobSubmissionClient(address)
        except ConnectionError:
            if waited >= CONNECT_WAIT_S:
                raise
            if waited == 0.0:
                print(
                    f"[rpg] no answer from the Ray cluster at {address} yet; retrying for up to {CONNECT_WAIT_S:.0f} s",
                    file=sys.stderr,
                )
            time.sleep(2.0)
            waited += 2.0


async def _tail(client, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        sys.stdout.write(lines)
        sys.stdout.flush()


def _submit_job(client, **job) -> None:
    """`client.submit_job(**job)`, retried with a growing pause (1, 2, 4, ... 10 s) up to AGENT_WAIT_S while the
    cluster answers that it has no job agent yet, or closes the connection (a busy head); any other error at once. A
    retry after a dropped connection that finds its own submission id taken means the first request got through."""
    waited, pause, dropped = 0.0, 1.0, False
    while True:
        try:
            client.submit_job(**job)
            return
        except RuntimeError as e:
            if dropped and "already exists" in str(e):
                print(
                    f"[rpg] job {job['submission_id']} reached the cluster before the connection dropped",
                    file=sys.stderr,
                )
                return
            if NO_AGENT not in str(e) or waited >= AGENT_WAIT_S:
                raise
            if waited == 0.0:
                print(
                    f"[rpg] the cluster's job agent is not up yet (Ray: {NO_AGENT!r}; a head that has just "
                    f"started); retrying for up to {AGENT_WAIT_S:.0f} s",
                    file=sys.stderr,
                )
        except OSError as e:  # requests' ConnectionError: the head's dashboard closed the connection
            if waited >= AGENT_WAIT_S:
                raise
            dropped = True
            print(
                f"[rpg] the cluster closed the connection ({e}); retrying for up to {AGENT_WAIT_S - waited:.0f} s",
                file=sys.stderr,
            )
        time.sleep(pause)
        waited += pause
        pause = min(2 * pause, 10.0)


def submit(cmd: List[str], env: Dict[str, str], repo: str, exp_name: str, names: Sequence[str], client=None) -> int:
    """Submit `cmd` as a Ray job; return the process's exit status (the job's when followed). `client`: for tests."""
    address = env["RAY_ADDRESS"]
    try:
        follow = follow_setting(env)
        all_names = [*names, *job_env_names(env.get("RPG_JOB_ENV", ""))]
        client = client or _client(address)
    except SubmitError as e:
        print(f"[rpg] error: {e}", file=sys.stderr)
        return 2
    job_id = env.get("RPG_RAY_JOB_ID") or default_job_id(exp_name)
    print(f"[rpg] Ray job submission id: {job_id} (cluster {address})", file=sys.stderr)
    print(f"[rpg]   follow: ray job logs --address {address} --follow {job_id}", file=sys.stderr)
    print(f"[rpg]   status: ray job status --address {address} {job_id}", file=sys.stderr)
    print(f"[rpg]   stop:   ray job stop --address {address} {job_id}", file=sys.stderr)
    _submit_job(client, entrypoint=shlex.join(cmd), submission_id=job_id, runtime_env=runtime_env(env, repo, all_names))
    if not follow:
        return 0
    try:
        asyncio.run(_tail(client, job_id))
    except KeyboardInterrupt:
        print(
            f"\n[rpg] stopped following; the job goes on (stop it: ray job stop --address {address} {job_id})",
            file=sys.stderr,
        )
        return 130
    status = str(client.get_job_status(job_id))
    print(f"[rpg] Ray job {job_id}: {status}", file=sys.stderr)
    return 0 if status.endswith("SUCCEEDED") else 1
