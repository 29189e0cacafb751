"""scripts/test.sh (the README's test command, what CI runs) exits 0 when the tests it selects pass.

Runs the script itself, in two lanes (RPG_TEST_WORKERS=2), on one cheap test of each environment: its exit code is the
contract CI reads (a script that passes every test and still exits non-zero fails CI). Under a minute: one pytest
collection per job of its queue; both environments exist already (this suite runs in one of them). A probe plugin
(tests/lane_probe.py) shows where each job ran: the trainer jobs in lane 1 with Ray's workers at normal priority, the
jobs beside them at nice 19.

The script gives the modules marked `trainer` a job of their own, so that no two trainer start-ups overlap by
accident: a module that starts a trainer or a Ray cluster must carry the mark (checked below).

The CPU platform's variables are exported for it (VERL_PLATFORM=cpu, VERL_ENGINE_DEVICE=cuda): a developer who ran a
CPU recipe by hand may have them, and an in-process CPU-engine test of this session sets them in this process. The
test command's collection must not depend on them (verl modules that ask for the device at import time fail under
VERL_PLATFORM=cpu unless rpg.cpu.platform registered it first).
"""

import os
import re
import subprocess
import sys

from cpu_trainer import ROOT

STARTS = re.compile(r"^\s*(from cpu_trainer import .*\b(run_cpu_recipe|start_cpu_recipe)\b|from local_ray_head import|"
                    r"import local_ray_head)", re.M)  # fmt: skip


def test_the_test_command_exits_0_when_its_tests_pass(tmp_path):
    selected = "test_summarize_hand_computed or test_patch2_refuses_a_changed_signature"
    probe = tmp_path / "lanes.txt"  # tests/lane_probe.py: each job's lane, niceness and Ray's worker niceness
    path = [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]  # -p lane_probe imports it
    env = {**os.environ, "RPG_TEST_WORKERS": "2", "VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda",
           "RPG_LANE_PROBE": str(probe), "PYTHONPATH": os.pathsep.join(path)}  # fmt: skip
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), "-q", "-p", "no:cacheprovider", "-p", "lane_probe",
                          "-k", selected], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    text = out.stdout + out.stderr
    for job in ("main:others", "vllm:test_vllm_compat_on_cpu"):  # the two jobs that hold the selected tests
        assert f"[test.sh] {job}: pytest exit 0" in text, text[-3000:]
    assert "[test.sh] main:trainers: pytest exit 5" in text, "a job that selects nothing is reported, not failed"
    assert re.search(r"\[test\.sh\]   main:others: exit 0, \d+ s\n", text), text[-2000:]  # the job table
    busy = re.search(r"CPU busy meanwhile: (\d+) of (\d+) core-seconds \((\d+)%, (\d+) CPUs\)", text)
    assert busy and 0 < int(busy.group(1)) <= int(busy.group(2)) and int(busy.group(4)) == len(os.sched_getaffinity(0)), text[-2000:]
    assert out.returncode == 0, f"every selected test passed, yet scripts/test.sh exited {out.returncode}:\n{text[-2000:]}"
    # the lanes: every trainer job (main:trainers, the vLLM modules that start a trainer) in lane 1, one at a time, its
    # Ray workers at normal priority; the other jobs that ran beside them (lane 2) at nice 19
    trainer_modules = [p for p in (ROOT / "tests" / "vllm_cpu").glob("test_*_on_cpu.py")
                       if "pytest.mark.trainer" in p.read_text()]  # fmt: skip
    jobs = [line.split() for line in probe.read_text().splitlines()]
    base = os.nice(0)  # this process's niceness: the jobs' is relative to it
    trainers = [job for job in jobs if job[2] == "0"]
    assert len(trainers) == 1 + len(trainer_modules), jobs
    assert all(lane == "1" and int(nice) == base for lane, nice, _ in trainers), jobs
    beside = [job for job in jobs if job[0] != "1"]
    assert beside and all(int(nice) == min(base + 19, 19) and ray == "-" for _, nice, ray in beside), jobs


def test_every_module_that_starts_a_trainer_or_a_cluster_is_marked_trainer():
    starters = {p.relative_to(ROOT).as_posix(): "pytest.mark.trainer" in p.read_text()
                for p in (ROOT / "tests").rglob("*_on_cpu.py") if STARTS.search(p.read_text())}
    assert len(starters) >= 7, f"the pattern no longer finds the end-to-end modules: {sorted(starters)}"
    unmarked = sorted(name for name, marked in starters.items() if not marked)
    assert not unmarked, f"these modules start a trainer or a Ray cluster without `pytest.mark.trainer`: {unmarked}"


def test_the_environment_is_byte_compiled():
    """scripts/setup_env.sh byte-compiles what the test suite's processes import (rpg/tools/byte_compile.py): where
    PYTHONDONTWRITEBYTECODE is set (the development machine) nothing else would, and every process of every trainer
    start-up would compile torch, transformers and verl from source (`import verl`: twice the CPU). `--check` imports
    the same modules in a fresh process that writes nothing and names each one of site-packages whose bytecode is
    missing or stale (on an environment that was not compiled: every one, exit 1)."""
    command = [sys.executable, "-m", "rpg.tools.byte_compile", "--check"]
    # as setup_env.sh runs it: without the CPU platform's variables an in-process engine test left in this process
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    counts = re.search(r"\[byte_compile\] (\d+) of (\d+) imported modules of \S+ compiled", out.stdout)
    assert counts and int(counts.group(2)) > 1000, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.returncode == 0 and counts.group(1) == counts.group(2), (
        f"{sys.prefix} is not byte-compiled (run bash scripts/setup_env.sh), or an entry of rpg/tools/byte_compile.py "
        "no longer imports (its name is below)\n"
        + out.stdout[-2000:] + out.stderr[-2000:]
    )
