"""Seeded arithmetic tasks for a small pretrained chat model (docs/benchmarks.md#real-model), scored by the *last
number* of the response (``rpg.data.reward.last_number_score``, data_source ``last_number``).

Each task is a finite, ordered list of distinct problems (question text, integer answer). A split shuffles that list
with ``random.Random(seed)`` and takes the first ``n_val`` problems for validation and the next ``n_train`` (default:
all the rest) for training, so the two are disjoint by construction and the same seed gives the same files.

The candidates and the base model's measured accuracy on each are in docs/benchmarks.md#real-model; the task the
real-model recipe trains on was chosen there (a start between 10 % and 60 %, well above chance).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import NamedTuple

Problem = tuple[str, int]


class Task(NamedTuple):
    """One candidate task: what it asks and its problems."""

    holds: str
    problems: Callable[[], list[Problem]]


def _add1() -> list[Problem]:
    return [(f"What is {a} + {b}?", a + b) for a, b in itertools.product(range(1, 10), repeat=2)]


def _add2() -> list[Problem]:
    return [(f"What is {a} + {b}?", a + b) for a, b in itertools.product(range(10, 100), repeat=2)]


def _sub1() -> list[Problem]:
    return [(f"What is {a} - {b}?", a - b) for a, b in itertools.product(range(1, 19), range(1, 10)) if a >= b]


def _mul1() -> list[Problem]:
    return [(f"What is {a} times {b}?", a * b) for a, b in itertools.product(range(2, 10), repeat=2)]


SHORT = " Reply with only the number."


def _add1_short() -> list[Problem]:
    return [(q + SHORT, a) for q, a in _add1()]


def _mul1_short() -> list[Problem]:
    return [(q + SHORT, a) for q, a in _mul1()]


def _sub1_short() -> list[Problem]:
    return [(q + SHORT, a) for q, a in _sub1()]


NAMES = ("Tom", "Anna", "Sam", "Lily", "Ben", "Mia")
THINGS = ("apples", "books", "coins", "pens", "cards", "shells")


def _word1() -> list[Problem]:
    """One-step word problems: someone has ``a`` things and gets ``b`` more (a, b in 1..9)."""
    return [
        (f"{name} has {a} {thing}. {name} gets {b} more {thing}. How many {thing} does {name} have now?", a + b)
        for name, thing, a, b in itertools.product(NAMES, THINGS, range(1, 10), range(1, 10))
    ]


#: The candidate tasks, by the name ``rpg-prepare-data`` takes (prefixed ``arith-``).
TASKS: dict[str, Task] = {
    "add1": Task("one-digit addition, 1..9 + 1..9 (81 problems)", _add1),
    "sub1": Task("one-digit subtraction, a - b with 1 <= b <= 9, b <= a <= 18 (126 problems)", _sub1),
    "mul1": Task("one-digit multiplication, 2..9 times 2..9 (64 problems)", _mul1),
    "add1-short": Task("one-digit addition, asked for the number only", _add1_short),
    "sub1-short": Task("one-digit subtraction, asked for the number only", _sub1_short),
    "mul1-short": Task("one-digit multiplication, asked for the number only", _mul1_short),
    "add2": Task("two-digit addition, 10..99 + 10..99 (8100 problems)", _add2),
    "word1": Task("one-step word problems: has a, gets b more (2916 problems)", _word1),
}


class TaskError(ValueError):
    """A task name or split size that cannot be served; the message names the valid choices."""


def problems(task: str) -> list[Problem]:
    """Every problem of ``task`` in its fixed order (distinct questions)."""
    if task not in TASKS:
        raise TaskError(f"unknown task {task!r}; valid: {', '.join(TASKS)}")
    return TASKS[task].problems()


def chance(task: str) -> float:
    """The accuracy of guessing uniformly among the task's distinct answers: 1 / (number of distinct answers)."""
    return 1.0 / len({answer for _, answer in problems(task)})


def split(task: str, seed: int, n_val: int, n_train: int | None = None) -> tuple[list[Problem], list[Problem]]:
    """``(train, val)``: the task's problems shuffled with ``seed``; the first ``n_val`` validate, the next
    ``n_train`` (None: all the rest) train. Disjoint by construction; raises ``TaskError`` if they do not fit."""
    pool = problems(task)
    rest = len(pool) - n_val
    if n_val < 1 or rest < 1 or (n_train is not None and not 1 <= n_train <= rest):
        raise TaskError(
            f"task {task!r} has {len(pool)} problems: choose 1 <= n_val < {len(pool)} and 1 <= n_train <= "
            f"{len(pool)} - n_val (got n_val={n_val}, n_train={n_train})"
        )
    random.Random(seed).shuffle(pool)
    val = pool[:n_val]
    train = pool[n_val:] if n_train is None else pool[n_val : n_val + n_train]
    return train, val
