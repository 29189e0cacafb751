"""scripts/test.sh (the README's test command, what CI runs) exits 0 when the tests it selects pass.

Runs the script itself, serially (RPG_TEST_WORKERS=0), on one cheap test of each environment: its exit code is the
contract CI reads (a script that passes every test and still exits non-zero fails CI). About 30 s: two pytest
collections; both environments exist already (this suite runs in one of them).

The CPU platform's variables are exported for it (VERL_PLATFORM=cpu, VERL_ENGINE_DEVICE=cuda): a developer who ran a
CPU recipe by hand may have them, and an in-process CPU-engine test of this session sets them in this process. The
test command's collection must not depend on them (verl modules that ask for the device at import time fail under
VERL_PLATFORM=cpu unless rpg.cpu.platform registered it first).
"""

import os
import subprocess

from cpu_trainer import ROOT


def test_the_test_command_exits_0_when_its_tests_pass():
    selected = "test_summarize_hand_computed or test_patch2_refuses_a_changed_signature"
    env = {**os.environ, "RPG_TEST_WORKERS": "0", "VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), "-q", "-p", "no:cacheprovider", "-k", selected],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    text = out.stdout + out.stderr
    assert "[test.sh] main: pytest exit 0" in text and "[test.sh] vllm: pytest exit 0" in text, text[-3000:]
    assert out.returncode == 0, f"every selected test passed, yet scripts/test.sh exited {out.returncode}:\n{text[-2000:]}"
