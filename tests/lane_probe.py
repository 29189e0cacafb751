"""A pytest plugin for the test command's self-test (tests/test_test_command_on_cpu.py): `-p lane_probe` makes each
pytest job of scripts/test.sh append "<lane> <niceness> <RAY_worker_niceness or ->" to the file $RPG_LANE_PROBE."""

import os


def pytest_sessionstart(session):
    path = os.environ.get("RPG_LANE_PROBE")
    if path:
        with open(path, "a") as out:
            lane, ray = os.environ.get("RPG_TEST_LANE", "?"), os.environ.get("RAY_worker_niceness", "-")
            out.write(f"{lane} {os.nice(0)} {ray}\n")
