"""A CPU recipe submitted to a real Ray cluster with RAY_ADDRESS, exactly as a user's cluster gets it.

A private Ray head (tests/cluster/local_ray_head.py: 127.0.0.1, its own temp dir and ports, 16 CPUs and 1 fake GPU
as `ray start --head --num-cpus=16 --num-gpus=1` would give) is started from the project's environment. Then
`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` runs with `RAY_ADDRESS=http://127.0.0.1:<dashboard port>` and the
launcher's defaults (no PYTHON: the job runs `python3 -m rpg.launch` on the cluster), i.e. through the launcher's
Ray submission (rpg/preflight/ray_submit.py, Ray's job-submission SDK): the repo is uploaded as the job's working
directory, the `rpg` package as a py_module, the CPU profile's environment travels in the runtime env, and verl's trainer joins the existing cluster. The head uses Ray's
token authentication with its own token; the submitting shell has RAY_AUTH_MODE=token and the token's path, as a
user's shell needs for such a cluster (recipe/rpg/README.md, "Several nodes").

* a 2-step run with validation succeeds: the script prints the submission id and the commands to follow it, follows
  the job to the end and exits 0; `ray job status` says SUCCEEDED; the metrics file holds both steps and validation;
* a bad override fails: the script exits non-zero, the job is FAILED in `ray job status`, and the launcher's error
  message naming the bad setting is in the job's logs (streamed by the script and kept by Ray).

Cost: ~2 min on 2 cores (head start ~10 s, one trainer start-up, one failing launch). Needs artifacts/tiny.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_trainer import check_steps, start_cpu_recipe

pytestmark = pytest.mark.slow  # a minute or more: scheduled first (tests/conftest.py)

BIN = Path(sys.executable).parent  # the project's environment, activated as a user's shell would have it
RAY = str(BIN / "ray")


@pytest.fixture(scope="module")
def head(tiny_dir):
    from local_ray_head import LocalRayHead

    h = LocalRayHead(num_cpus=16, num_gpus=1)
    try:
        yield h
    finally:
        survivors = h.stop()
    assert not survivors, f"processes of the test's Ray head survived SIGKILL: {survivors}"


def submit(tmp: Path, name: str, head, overrides: list[str]) -> tuple[int | str, str, str]:
    rc, text = start_cpu_recipe(tmp, name, ["trainer.val_before_train=False", *overrides], timeout_s=600,
                                RAY_ADDRESS=head.address, PYTHON=None, PATH=f"{BIN}:{os.environ['PATH']}",
                                **head.client_env, CPU_STEPS="2", CPU_BATCH="4", CPU_MINI_BATCH="2", CPU_N="4", CPU_TEST_FREQ="2",
                                CPU_SEED="0")  # fmt: skip
    found = re.search(r"\[rpg\] Ray job submission id: (\S+) \(cluster (\S+)\)", text)
    assert found, f"{name}: no submission id printed:\n{text[-3000:]}"
    job_id = found.group(1)
    assert found.group(2) == head.address
    assert f"ray job logs --address {head.address} --follow {job_id}" in text
    return rc, text, job_id


def ray_job(head, *args: str) -> str:
    """`ray job <args> --address <head>` as a client of the test's head; stdout + stderr."""
    env = {k: v for k, v in {**os.environ, **head.client_env}.items() if v is not None}
    out = subprocess.run([RAY, "job", *args, "--address", head.address], capture_output=True, text=True, env=env,
                         timeout=60)  # fmt: skip
    return out.stdout + out.stderr


def test_recipe_job_succeeds_on_the_cluster(head, tmp_path):
    rc, text, job_id = submit(tmp_path, "ray_ok", head, [])
    assert rc == 0, f"exit {rc}:\n{text[-4000:]}"
    assert "succeeded" in ray_job(head, "status", job_id).lower()
    records = [json.loads(line) for line in (tmp_path / "ray_ok.jsonl").read_text().splitlines()]
    train = check_steps(records, text, [1, 2])  # the job's console lines reach the submitting terminal
    assert any(k.startswith("val-core/") for k in train[2]), "no validation at step 2"


def test_failing_job_is_reported_as_failed(head, tmp_path):
    rc, text, job_id = submit(tmp_path, "ray_bad", head, ["actor_rollout_ref.actor.ppo_epochs=banana"])
    assert rc != 0, f"a bad override exited 0:\n{text[-3000:]}"
    status = ray_job(head, "status", job_id)
    assert "failed" in status.lower(), status
    logs = ray_job(head, "logs", job_id)
    error = "actor_rollout_ref.actor.ppo_epochs='banana' has type str; expected int"  # rpg.launch, inside the job
    assert error in logs and error in text, logs[-3000:]
