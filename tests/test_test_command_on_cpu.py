"""scripts/test.sh (the README's test command, what CI runs) exits 0 when the tests it selects pass.

Runs the script itself, in one lane (RPG_TEST_WORKERS=0), on one cheap test of each environment: its exit code is the
contract CI reads (a script that passes every test and still exits non-zero fails CI). About a minute: one pytest
collection per job of its queue; both environments exist already (this suite runs in one of them).

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

from cpu_trainer import ROOT

STARTS = re.compile(r"^\s*(from cpu_trainer import .*\b(run_cpu_recipe|start_cpu_recipe)\b|from local_ray_head import|"
                    r"import local_ray_head)", re.M)  # fmt: skip


def test_the_test_command_exits_0_when_its_tests_pass():
    selected = "test_summarize_hand_computed or test_patch2_refuses_a_changed_signature"
    env = {**os.environ, "RPG_TEST_WORKERS": "0", "VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), "-q", "-p", "no:cacheprovider", "-k", selected],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    text = out.stdout + out.stderr
    for job in ("main:others", "vllm:test_vllm_compat_on_cpu"):  # the two jobs that hold the selected tests
        assert f"[test.sh] {job}: pytest exit 0" in text, text[-3000:]
    assert "[test.sh] main:trainers: pytest exit 5" in text, "a job that selects nothing is reported, not failed"
    assert re.search(r"\[test\.sh\]   main:others: exit 0, \d+ s\n", text), text[-2000:]  # the job table
    busy = re.search(r"CPU busy meanwhile: (\d+) of (\d+) core-seconds \((\d+)%, (\d+) CPUs\)", text)
    assert busy and 0 < int(busy.group(1)) <= int(busy.group(2)) and int(busy.group(4)) == len(os.sched_getaffinity(0)), text[-2000:]
    assert out.returncode == 0, f"every selected test passed, yet scripts/test.sh exited {out.returncode}:\n{text[-2000:]}"


def test_every_module_that_starts_a_trainer_or_a_cluster_is_marked_trainer():
    starters = {p.relative_to(ROOT).as_posix(): "pytest.mark.trainer" in p.read_text()
                for p in (ROOT / "tests").rglob("*_on_cpu.py") if STARTS.search(p.read_text())}
    assert len(starters) >= 7, f"the pattern no longer finds the end-to-end modules: {sorted(starters)}"
    unmarked = sorted(name for name, marked in starters.items() if not marked)
    assert not unmarked, f"these modules start a trainer or a Ray cluster without `pytest.mark.trainer`: {unmarked}"
