"""rpg.atomic: complete-or-absent output, temp files removed on errors, Ctrl-C and SIGTERM, umask-following mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rpg.atomic import (
    SIGTERM_EXIT_CODE,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)


@pytest.fixture
def umask():
    """Set the process umask for one test (restored afterwards)."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def test_writers_replace_content_and_create_parents(tmp_path):
    out = tmp_path / "a" / "b" / "x.txt"
    atomic_write_text(out, "héllo\n")
    assert out.read_text(encoding="utf-8") == "héllo\n"
    atomic_write_bytes(out, b"\x00\x01")
    assert out.read_bytes() == b"\x00\x01"
    atomic_write_json(out, {"b": 1, "a": [1.5]}, sort_keys=True)
    assert out.read_text() == '{"a": [1.5], "b": 1}\n' and json.loads(out.read_text()) == {"a": [1.5], "b": 1}
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.txt"]


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_mode_follows_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    atomic_write_text(tmp_path / "new.txt", "x")
    assert (tmp_path / "new.txt").stat().st_mode & 0o777 == mode
    with atomic_path(tmp_path / "by_path.bin") as tmp:
        tmp.write_bytes(b"y")
    assert (tmp_path / "by_path.bin").stat().st_mode & 0o777 == mode


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_failure_keeps_the_old_file_and_removes_the_temp(tmp_path, exc):
    out = tmp_path / "x.txt"
    out.write_text("old")
    with pytest.raises(type(exc)):
        with atomic_path(out) as tmp:
            assert tmp.parent == tmp_path and tmp.exists()
            tmp.write_text("half")
            raise exc
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]


def test_sigterm_to_a_cli_removes_the_temp_file(tmp_path):
    """A real SIGTERM while the temp file is being written: exit 143, no temp file, no output."""
    out = tmp_path / "out.txt"
    code = textwrap.dedent(
        f"""
        import sys, time
        from rpg.atomic import atomic_path, sigterm_exits
        with sigterm_exits():
            with atomic_path({str(out)!r}) as tmp:
                tmp.write_text("partial")
                print("writing", flush=True)
                time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert len(list(tmp_path.iterdir())) == 1  # the temp file exists while writing
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == SIGTERM_EXIT_CODE
    assert list(tmp_path.iterdir()) == []
