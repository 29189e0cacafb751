"""rpg/preflight/ray_submit.py waits for a cluster whose job agent is not up yet.

A Ray head that has just started (`ray start --head`, or a cluster under load) answers a job submission with HTTP 500
"No available agent to submit job, please try again later" until its dashboard agent is ready; the e2e cluster test
met it on a loaded machine. The submission retries that one answer with a growing pause, up to `AGENT_WAIT_S`, and
says so; so it does when the busy head closes the connection (a fresh-clone run met that right after the agent came
up), without submitting twice: a retry that finds its own submission id taken is the first request having arrived.
Any other error is raised at once."""

from __future__ import annotations

import pytest

from rpg.preflight import ray_submit

NO_AGENT = "Request failed with status code 500: No available agent to submit job, please try again later.."


class FakeClient:
    def __init__(self, failures: list[Exception]):
        self.failures, self.calls = list(failures), 0

    def submit_job(self, **kwargs):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return kwargs["submission_id"]


def submit(client, monkeypatch, sleeps):
    monkeypatch.setattr(ray_submit.time, "sleep", sleeps.append)
    env = {"RAY_ADDRESS": "http://127.0.0.1:1", "RPG_RAY_FOLLOW": "0", "RPG_RAY_JOB_ID": "job-1"}
    return ray_submit.submit(["python3", "-m", "rpg.launch"], env, "/repo", "exp", [], client=client)


def test_no_available_agent_is_retried_until_the_agent_answers(monkeypatch, capsys):
    client, sleeps = FakeClient([RuntimeError(NO_AGENT)] * 3), []
    assert submit(client, monkeypatch, sleeps) == 0
    assert client.calls == 4 and sleeps == [1.0, 2.0, 4.0]
    assert "job agent is not up yet" in capsys.readouterr().err


def test_the_wait_is_bounded(monkeypatch):
    client, sleeps = FakeClient([RuntimeError(NO_AGENT)] * 100), []
    with pytest.raises(RuntimeError, match="No available agent"):
        submit(client, monkeypatch, sleeps)
    assert sum(sleeps) >= ray_submit.AGENT_WAIT_S and sum(sleeps[:-1]) < ray_submit.AGENT_WAIT_S


def test_other_errors_are_raised_at_once(monkeypatch):
    client, sleeps = FakeClient([RuntimeError("Request failed with status code 400: bad runtime_env")]), []
    with pytest.raises(RuntimeError, match="bad runtime_env"):
        submit(client, monkeypatch, sleeps)
    assert client.calls == 1 and sleeps == []


def test_a_cluster_that_does_not_answer_yet_is_retried_briefly(monkeypatch, capsys):
    import ray.job_submission

    attempts, sleeps = [], []

    def client(address):
        attempts.append(address)
        if len(attempts) < 3:
            raise ConnectionError(f"Failed to connect to Ray at address: {address}.")
        return "client"

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", client)
    monkeypatch.setattr(ray_submit.time, "sleep", sleeps.append)
    assert ray_submit._client("http://127.0.0.1:1") == "client" and len(attempts) == 3
    assert "no answer from the Ray cluster" in capsys.readouterr().err
    attempts.clear()
    monkeypatch.setattr(ray_submit, "CONNECT_WAIT_S", 0.0)  # a wrong address: Ray's own error, without a long wait
    with pytest.raises(ConnectionError, match="Failed to connect"):
        ray_submit._client("http://127.0.0.1:1")


def dropped():
    """What requests raises when a busy head's dashboard closes the connection (seen in a fresh-clone test run)."""
    import requests

    return requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected('Remote end closed "
                                               "connection without response'))")  # fmt: skip


def test_a_dropped_connection_is_retried(monkeypatch, capsys):
    client, sleeps = FakeClient([RuntimeError(NO_AGENT), dropped()]), []
    assert submit(client, monkeypatch, sleeps) == 0
    assert client.calls == 3 and sleeps == [1.0, 2.0]
    assert "closed the connection" in capsys.readouterr().err


def test_a_job_that_arrived_before_the_connection_dropped_is_not_submitted_twice(monkeypatch, capsys):
    exists = RuntimeError("Request failed with status code 400: Job with submission_id job-1 already exists. "
                          "Please use a different submission_id.")  # fmt: skip
    client, sleeps = FakeClient([dropped(), exists]), []
    assert submit(client, monkeypatch, sleeps) == 0 and client.calls == 2
    assert "job-1 reached the cluster before the connection dropped" in capsys.readouterr().err
    client, sleeps = FakeClient([exists]), []  # without a dropped connection before it: another job's id, an error
    with pytest.raises(RuntimeError, match="already exists"):
        submit(client, monkeypatch, sleeps)
