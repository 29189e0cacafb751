"""The launcher's refusals as messages (docs/launcher.md#refusals): a check of the project that refuses a config
(`RecipeConfigError`: the RPG and recipe rules, missing inputs, the memory plan, the free disk, ...) prints one short
paragraph, `[rpg] error: <what, the value, the fix>`, and exits with status 1; no Hydra "Error executing job", no
traceback. `HYDRA_FULL_ERROR=1` (Hydra's own switch) shows the traceback instead. Any other exception is not ours to
explain: it keeps its traceback (Hydra prints it). Standard library only."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

__all__ = ["FULL_ERROR_ENV", "PREFIX", "as_message", "full_error", "message"]

FULL_ERROR_ENV = "HYDRA_FULL_ERROR"
PREFIX = "[rpg] error: "


def full_error(environ=None) -> bool:
    return (os.environ if environ is None else environ).get(FULL_ERROR_ENV, "") == "1"


def message(error: BaseException) -> str:
    """`[rpg] error: ...`: the error's text, each further line indented under it."""
    return PREFIX + str(error).strip().replace("\n", "\n  ")


@contextlib.contextmanager
def as_message(*kinds: type) -> Iterator[None]:
    """Inside: an exception of `kinds` (default: `RecipeConfigError`) becomes `SystemExit(message)` (status 1),
    unless HYDRA_FULL_ERROR=1."""
    if not kinds:  # compose imports omegaconf, and this module is on the launcher's early path (standard library)
        from rpg.preflight.compose import RecipeConfigError

        kinds = (RecipeConfigError,)
    try:
        yield
    except kinds as e:
        if full_error():
            raise
        raise SystemExit(message(e)) from None
