"""One micro-batch inside verl's ``ppo_loss`` as RPG's pieces and the registered losses share it: `MicroBatch`.

The sibling of `rpg.reference.step` (one training step): verl 0.9.1 calls a registered policy loss with its seven
arguments only, so what the loss needs beyond them travels in this record. The one wrapper of ``ppo_loss``
(`rpg.patches`) opens a fresh record around every call (`opened`); the pieces installed there fill it before verl's
own ``ppo_loss`` runs:

* ``ref_log_prob``: the reference log-probs verl shipped with the micro-batch, padded like the loss's ``log_prob``
  (`rpg.reference.adapter`, ``RPG_INSTALL=ref_log_prob``); None without a reference model;
* ``topk``: the top-k KL terms of the micro-batch (`rpg.topk_hook.TopKTerms`, ``RPG_INSTALL=topk_kl``), or None.

The losses read them through `rpg.reference.adapter.current_ref_log_prob` and `rpg.topk_hook.current`; outside
``ppo_loss`` (`current()` None) both are None. Pure Python: imports nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator, Optional

__all__ = ["MicroBatch", "current", "opened"]


@dataclass
class MicroBatch:
    """What the pieces of ``ppo_loss`` publish for the micro-batch inside it (module docstring)."""

    ref_log_prob: Any = None  # detached (bs, response_len) tensor, zeros on padding
    topk: Any = None  # rpg.topk_hook.TopKTerms in the loss's (bs, response_len) layout


_CURRENT: contextvars.ContextVar[Optional[MicroBatch]] = contextvars.ContextVar("rpg_micro_batch", default=None)


def current() -> Optional[MicroBatch]:
    """The record of the micro-batch inside verl's ``ppo_loss`` in this context, or None outside it."""
    return _CURRENT.get()


@contextlib.contextmanager
def opened(record: Optional[MicroBatch] = None) -> Iterator[MicroBatch]:
    """Make `record` (default: an empty one) the current micro-batch for the duration of the block."""
    token = _CURRENT.set(MicroBatch() if record is None else record)
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)
