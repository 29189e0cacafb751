"""The reference's per-response score (docs/differences.md#s7-4), built from verl 0.9.1's own scorers.

Use it as verl's custom score function together with verl's ``dapo`` reward manager (which adds the
overlong penalty, docs/differences.md#s7-4, and places the reward on the last valid token, step 4)::

    reward.reward_manager.name=dapo
    reward.custom_reward_function.path=pkg://rpg.data.reward
    reward.custom_reward_function.name=compute_score

Why verl's ``default_compute_score`` alone is not enough (checked in verl 0.9.1,
``verl/utils/reward_score/__init__.py``; pinned by ``tests/data/test_reward_semantics_on_cpu.py``):

1. ``amc_23`` (and any ``amc*`` source) raises ``NotImplementedError``; the reference routes ``amc*``
   to ``math_dapo``.
2. ``minerva-math`` and ``olympiadbench`` raise ``NotImplementedError``; the reference scores them with
   Math-Verify as +1/-1 with a boolean ``acc``. verl's Math-Verify helper returns a bare 1.0/0.0 float,
   which the DAPO manager would turn into ``acc=score`` with no ``pred`` key -- and the reward loop takes
   the extra-info keys of the *first* sample of a batch, so a batch mixing ``math_dapo`` and Math-Verify
   sources would fail. Here every source returns the same keys ``score, acc, pred``.
3. verl 0.9.1's ``math_dapo.compute_score`` falls back to the last ``\\boxed{}`` when the response has no
   ``Answer:`` line. The reference extracts only the last ``Answer: ...`` line (Minerva criterion) from
   the last 300 characters; a response with only ``\\boxed{..}`` scores -1 there (docs/differences.md#s7-4). The
   ``math_dapo`` scorer below therefore calls verl's ``is_correct_minerva`` directly.

4. ``last_number`` (the real-model tasks of ``rpg.data.tasks``, docs/benchmarks.md#real-model) has no scorer in verl:
   verl's GSM8K scorer extracts the last number in its flexible mode but is routed only for ``openai/gsm8k``, scores
   0/1 and compares the text (``"12."`` is not ``"12"``). ``last_number_score`` reuses its extraction, normalises it
   and scores +1/-1 like the others.

Every other ``data_source`` is delegated unchanged to verl's ``default_compute_score``.

What the trainer hands over: verl reads each parquet row with Hugging Face ``datasets``, so the ground truth has the
Python type of its column (str, int, float, bool, list or None) and the data source may be None. The scorers owned
here take the ground truth through ``ground_truth_text``: a number or a one-element list scores as its text (``5``,
``5.0`` and ``[5]`` all match ``Answer: 5``); a bool, None, NaN, a list of another length or any other value raises
``ValueError``. Delegated sources get the value unchanged (verl's scorers define their own input). ``rpg.launch``
checks every row of the local train/validation files with ``has_scorer`` and ``ground_truth_text`` before a run
starts, so these errors surface at launch, not at the first validation.
"""

from __future__ import annotations

import contextlib
import io
import math
import numbers
from collections.abc import Callable
from typing import Any

#: Characters of the response tail the reference's math_dapo scorer looks at (docs/differences.md#s7-4).
MATH_DAPO_TAIL_CHARS = 300

#: ``data_source`` values the reference scores with math_dapo: exact names and name prefixes (docs/differences.md#s7-4).
MATH_DAPO_SOURCES = frozenset({"math_dapo"})
MATH_DAPO_PREFIXES = ("aime", "amc")

#: ``data_source`` of the real-model tasks (rpg.data.tasks, docs/benchmarks.md#real-model): the last number of the
#: response is the answer, as in verl's GSM8K scorer's flexible mode.
LAST_NUMBER_SOURCE = "last_number"

#: ``data_source`` values the reference scores with Math-Verify (docs/differences.md#s7-4).
MATH_VERIFY_SOURCES = frozenset(
    {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "math_500", "minerva-math", "olympiadbench"}
)

ScoreDict = dict[str, Any]


def math_dapo_score(solution_str: str, ground_truth: str) -> ScoreDict:
    """Reference math_dapo scoring (docs/differences.md#s7-4): last ``Answer: ...`` line in the last 300 characters,
    Minerva normalisation of prediction and ground truth, exact string match.

    Returns ``{"score": +1.0 | -1.0, "acc": bool, "pred": normalised prediction or "[INVALID]"}``.
    """
    from verl.utils.reward_score.math_dapo import is_correct_minerva

    correct, pred = is_correct_minerva(solution_str[-MATH_DAPO_TAIL_CHARS:], ground_truth)
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}


MATH_VERIFY_WARMUP_S = 600.0  # the pool's first worker: a spawned interpreter that imports Math-Verify and sympy
_math_verify_warm = False


def _warm_math_verify(math_verify) -> None:
    """Start verl's Math-Verify subprocess pool once per process, outside the 30 s a verification may take: the first
    call otherwise pays the worker's spawn and imports within that timeout and, on a loaded node, scores a correct
    answer as wrong (seen: a fresh-clone test run, 30.3 s). Skipped if verl's pool helpers are not there."""
    global _math_verify_warm
    pool, verify = getattr(math_verify, "_get_pool", None), getattr(math_verify, "_verify_in_subprocess", None)
    if _math_verify_warm or pool is None or verify is None:
        return
    pool().submit(verify, "\\boxed{1}", "\\boxed{1}").result(timeout=MATH_VERIFY_WARMUP_S)
    _math_verify_warm = True


def math_verify_score(solution_str: str, ground_truth: str) -> ScoreDict:
    """Reference Math-Verify scoring (docs/differences.md#s7-4): gold wrapped as ``\\boxed{gt}``, verified by
    Math-Verify (verl's ``math_verify.compute_score``, which runs it in a subprocess pool with a timeout; a timeout
    counts as wrong). Score is +1/-1, ``acc`` the boolean verdict.

    ``pred`` is the content of the response's last ``\\boxed{}`` (or ``"[INVALID]"``): only a voting key
    for verl's ``maj@k`` metric; correctness does not depend on it.
    """
    from verl.utils.reward_score import math_verify
    from verl.utils.reward_score.math_dapo import last_boxed_only_string, remove_boxed

    _warm_math_verify(math_verify)
    correct = math_verify.compute_score(solution_str, ground_truth) > 0
    boxed = last_boxed_only_string(solution_str)
    pred = remove_boxed(boxed) if boxed is not None else "[INVALID]"
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}


def last_number(solution_str: str) -> str | None:
    """The last number of a response, as verl's GSM8K scorer extracts it in its flexible mode (the last match of
    ``-?[0-9.,]+`` in the last 300 characters that is not ``.`` or empty), then normalised: thousands commas removed
    and trailing ``.``/``,`` dropped (verl's regex keeps the full stop of "is 12." and would compare ``"12."``).
    ``None`` if the response has no number."""
    from verl.utils.reward_score.gsm8k import extract_solution

    found = extract_solution(solution_str, method="flexible")
    if found is None:
        return None
    found = found.replace(",", "").rstrip(".")
    return found or None


def last_number_score(solution_str: str, ground_truth: str) -> ScoreDict:
    """The real-model tasks' reward (docs/benchmarks.md#real-model): +1 if the response's last number equals the
    ground truth as a number (``"12"``, ``"12.0"`` and ``"12."`` all match 12), else -1. The ±1 scale of the
    reference's scorers (docs/differences.md#s7-4); unlike the paper's ``Answer:`` criterion it needs no format, so
    a model that never writes ``Answer:`` can earn it.

    Returns ``{"score": +1.0 | -1.0, "acc": bool, "pred": the last number or "[INVALID]"}``.
    """
    pred = last_number(solution_str)
    try:
        correct = pred is not None and float(pred) == float(ground_truth)
    except ValueError:  # "1.2.3" is a match of verl's pattern but not a number
        correct = False
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred if pred is not None else "[INVALID]"}


def own_sources() -> list[str]:
    """The ``data_source`` names scored here (``aime*`` = any name with that prefix), for error messages."""
    exact = MATH_DAPO_SOURCES | MATH_VERIFY_SOURCES | {LAST_NUMBER_SOURCE}
    return sorted(exact) + [f"{p}*" for p in MATH_DAPO_PREFIXES]


def scorer_for(data_source: str) -> Callable[[str, str], ScoreDict] | None:
    """The reference scorer for ``data_source``, or ``None`` if verl's default routing applies."""
    if data_source in MATH_DAPO_SOURCES or data_source.startswith(MATH_DAPO_PREFIXES):
        return math_dapo_score
    if data_source in MATH_VERIFY_SOURCES:
        return math_verify_score
    if data_source == LAST_NUMBER_SOURCE:
        return last_number_score
    return None


def ground_truth_text(ground_truth: Any) -> str:
    """The answer text of a ground truth as the scorers here compare it.

    str → itself; int → its decimal text; float → the int text if integral (``5.0`` → ``"5"``), else its
    shortest round-trip text (``0.5`` → ``"0.5"``); a one-element list, tuple or array → its element's text;
    numpy scalars as their Python value. Raises ``ValueError`` naming the value for bool, None, NaN/inf, lists of
    another length and any other type (no answer to compare against).
    """
    if isinstance(ground_truth, str):
        return str(ground_truth)
    if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, list | tuple):  # numpy scalar or array
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, list | tuple):
        if len(ground_truth) == 1 and not isinstance(ground_truth[0], list | tuple):
            return ground_truth_text(ground_truth[0])
        raise ValueError(
            f"ground truth {ground_truth!r} ({type(ground_truth).__name__} of {len(ground_truth)} elements) cannot "
            "be scored: one answer per row (a string, a number or a one-element list)"
        )
    if isinstance(ground_truth, numbers.Integral) and not isinstance(ground_truth, bool):
        return str(int(ground_truth))
    if isinstance(ground_truth, numbers.Real) and not isinstance(ground_truth, bool) and math.isfinite(ground_truth):
        value = float(ground_truth)
        return str(int(value)) if value.is_integer() else repr(value)
    raise ValueError(
        f"ground truth {ground_truth!r} ({type(ground_truth).__name__}) cannot be scored: give the answer as a "
        "string (or a finite number, or a one-element list)"
    )


def _check_data_source(data_source: Any) -> str:
    if not isinstance(data_source, str):
        raise ValueError(
            f"data_source={data_source!r} is not a string: every row needs a data_source naming its scorer "
            "(e.g. 'math_dapo', 'aime-2024'); fix the data file"
        )
    return data_source


def verl_has_scorer(data_source: str) -> bool:
    """True if verl's ``default_compute_score`` routes ``data_source`` to a scorer.

    verl 0.9.1 has no query for its routing: its dispatcher raises ``NotImplementedError`` for an unknown source
    before importing any scorer, while every routed scorer fails at once on a ``None`` response (or returns a
    score). The probe calls it that way, with the scorers' prints silenced; it runs no model and no sandbox.
    """
    from verl.utils.reward_score import default_compute_score

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            default_compute_score(data_source, None, None)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 -- the routed scorer rejected the probe: it exists
        return True
    return True


def has_scorer(data_source: Any) -> bool:
    """True if ``compute_score`` can score rows of ``data_source`` (its own scorers, else verl's routing)."""
    return isinstance(data_source, str) and (scorer_for(data_source) is not None or verl_has_scorer(data_source))


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any):
    """verl custom-reward-function signature (``reward.custom_reward_function``).

    Routes ``data_source`` as the reference does (docs/differences.md#s7-4); unknown sources go to verl's
    ``default_compute_score`` (which raises ``NotImplementedError`` naming the source if verl cannot
    score it either) with the ground truth unchanged. The scorers owned here read the ground truth through
    ``ground_truth_text`` (numbers and one-element lists are scored; see the module docstring).
    """
    scorer = scorer_for(_check_data_source(data_source))
    if scorer is None:
        from verl.utils.reward_score import default_compute_score

        return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    return scorer(solution_str, ground_truth_text(ground_truth))
