"""Atomic file output for the whole package: a file is either absent, its old version, or complete.

Every writer goes through `atomic_path`: the data is written to a temporary file in the target's directory (same file
system, so the final `os.replace` is atomic), flushed to disk, then renamed over the target. The temporary file is
removed on any exception, `KeyboardInterrupt` included; a CLI that also wraps its work in `sigterm_exits()` gets the
same clean-up on SIGTERM. The final file's mode follows the umask (0o666 & ~umask), like a file opened with `open()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


def _create_temp(target: Path) -> Path:
    """A new empty file next to `target`, created with mode 0o666 so that the kernel applies the umask."""
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the rename is still atomic
        if not directory:
            raise
    finally:
        os.close(fd)


def sibling_dir(out: Path, tag: str) -> Path:
    """A new hidden folder next to ``out`` (``.<name>.<tag><hex>``; created like any folder, so its mode follows the
    umask): where a tool builds a folder before renaming it into place, or moves the old one aside."""
    while True:
        path = out.with_name(f".{out.name}.{tag}{secrets.token_hex(4)}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def replace_dir(new: Path, out: Path) -> None:
    """Put the finished folder `new` at `out` by renames (an existing `out` is moved aside into a hidden sibling first,
    then removed), so `out` is never a half-written folder."""
    if not out.exists():
        os.replace(new, out)
        return
    stale = sibling_dir(out, "old.")
    os.replace(out, stale / "x")
    os.replace(new, out)
    shutil.rmtree(stale, ignore_errors=True)


def shown(names: list[str], n: int = 5) -> str:
    """The first `n` of `names`, comma-separated, and how many more (for a refusal that lists files)."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it is fsync'd and renamed to `path` (parents are created).

    The temporary file exists (empty) when the block starts; write it by path (`pq.write_table(t, tmp)`,
    `tmp.write_bytes(...)`). On any exception, including KeyboardInterrupt and `SystemExit`, it is removed and
    `path` is left untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temp(target)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync(target.parent, directory=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (see `atomic_path`)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """Write `text` to `path` atomically (see `atomic_path`)."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike, obj: Any, **json_kwargs: Any) -> None:
    """Write `obj` as JSON (`json.dumps(obj, **json_kwargs)`, newline-terminated) to `path` atomically."""
    atomic_write_text(path, json.dumps(obj, **json_kwargs) + "\n")


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Within the block, SIGTERM raises `SystemExit(143)` instead of killing the process at once, so `finally`
    blocks and `atomic_path` remove their temporary files. For CLIs; a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum, frame):
        raise SystemExit(SIGTERM_EXIT_CODE)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
