"""Build the RPG training and evaluation parquet files in verl's RL schema (docs/differences.md#s7-2).

Every output row is ::

    data_source   str    scorer key: "math_dapo" (DAPO train, AIME 2024), "aime2025", "amc_23",
                         "minerva-math", "olympiadbench" (docs/differences.md#s7-2; score them with rpg.data.reward)
    prompt        list   [{"content": PRE + question + POST, "role": "user"}]   (docs/differences.md#s7-3)
    ability       str    "MATH"
    reward_model  dict   {"ground_truth": answer string, "style": "rule-lighteval/MATH_v2"}
    extra_info    dict   {"index": int, "raw_problem": question, "split": None}

Training set: rows de-duplicated on (question, answer) (the original DAPO-Math-17k repeats every prompt
~100x), non-English rows removed, ``extra_info.index`` = row number. Evaluation sets: de-duplicated, then
every problem repeated k times (default 32, problem-major order) with ``extra_info.index`` = repeat index
0..k-1, for mean@k with ``val_kwargs.n=1`` (docs/differences.md#s7-6).

Note on verl 0.9.1: validation groups responses by a fresh uid per *row*, so with k-times repeated files
the metric is named ``val-core/<source>/acc/mean@1`` -- its value is exactly the paper's mean@k (every
problem has k rows). ``--repeat 1`` plus ``actor_rollout_ref.rollout.val_kwargs.n=k`` instead yields
``mean@k`` under that name, together with ``best@k`` (pass@k).

Input, per dataset: the Hugging Face hub (``datasets.load_dataset``; ``--hub-id/--hub-config/--hub-split``
override the defaults) or a local file (``--source PATH``, ``.parquet`` or ``.jsonl``). Accepted columns:

* question: ``problem`` | ``question`` | ``Problem`` | ``Question`` | ``prompt`` (a string), or a verl-style
  ``prompt`` message list whose user content is taken (the template PRE/POST is stripped if present);
* answer: ``answer`` | ``Answer`` | ``final_answer`` | ``ground_truth`` | ``reward_model.ground_truth``.

If several accepted columns are present they must agree (else the row is ambiguous and rejected). A
``solution`` column is never used as the answer (it is a worked solution). Answers are strings; integers
are written without a decimal point, one-element lists are unwrapped, longer lists joined with ", ", and
one pair of enclosing ``$...$`` is removed; answers are stripped of surrounding whitespace. Questions are kept
byte for byte, as the authors' files keep them (a problem that ends in a space keeps it in its prompt and so in its
tokens); only comparisons (de-duplication, agreeing columns, questions with several answers) ignore surrounding
whitespace, and the first row's raw text is the one written. Values that are neither text nor finite numbers (NaN,
infinities, booleans, dicts) are refused, never written as their spelling.

English filter (training sets): a row is non-English iff its question contains a CJK character
(CJK punctuation/ideographs, kana, Hangul, full-width forms; see ``CJK_RE``). This is a heuristic that
targets DAPO-Math-17k's Chinese prompts.

A malformed row (or a line that is not UTF-8) stops the run with the file, the 1-based row number and the field;
nothing is written. Outputs are written atomically (``rpg.atomic``: complete or absent, no temporary file left by
errors, Ctrl-C or SIGTERM; mode from the umask) and are byte-identical on rerun.

Generated arithmetic tasks (``arith-<task>``, rpg.data.tasks; docs/benchmarks.md#real-model): a seeded split of the
task's problems into ``<out-dir>/arith-<task>/train.parquet`` and ``val.parquet`` (disjoint; ``--seed``, ``--val-size``,
``--train-size``), one row per problem (validation not repeated: ``val_kwargs.n`` samples each), the question as the
user message without the template above (the base model never writes ``Answer:``), ``data_source="last_number"``
(rpg.data.reward: the last number of the response is the answer).

Examples::

    rpg-prepare-data arith-add1-short     # data/arith-add1-short/{train,val}.parquet, seed 0, 32 validation problems
    rpg-prepare-data all                  # everything from the hub into data/
    rpg-prepare-data aime-2025 --source my_aime25.jsonl --repeat 32
    rpg-prepare-data dapo-math-17k        # unfiltered DAPO: dedup + English filter

(``rpg-prepare-data`` is the console script of ``python -m rpg.tools.prepare_data``.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpg.atomic import atomic_path, sigterm_exits
from rpg.data import tasks
from rpg.data.reward import LAST_NUMBER_SOURCE, MATH_DAPO_PREFIXES, MATH_DAPO_SOURCES, MATH_VERIFY_SOURCES, scorer_for

#: Prompt template, byte-exact (docs/differences.md#s7-3). ``$Answer`` is literal text.
PRE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
POST = '\n\nRemember to put your answer on its own line after "Answer:".'
ABILITY = "MATH"
REWARD_STYLE = "rule-lighteval/MATH_v2"
DEFAULT_REPEAT = 32

QUESTION_COLUMNS = ("problem", "question", "Problem", "Question", "prompt")
ANSWER_COLUMNS = ("answer", "Answer", "final_answer", "ground_truth")

#: CJK punctuation, kana, CJK ext. A, CJK unified ideographs, Hangul syllables, full-width forms.
CJK_RE = re.compile("[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")


@dataclass(frozen=True)
class DatasetSpec:
    """One preparable dataset: where it comes from, how it is scored, and how it is written."""

    hub_id: str
    output: str  # default output path, relative to the working directory
    data_source: str
    train: bool  # True: dedup + English filter, no repetition; False: eval set repeated k times
    hub_config: str | None = None
    hub_split: str | None = None  # None: the dataset's only split


#: Default hub ids (override with --hub-id/--hub-config/--hub-split). The DAPO/AIME-2024 ids are the ones
#: the reference downloads (docs/differences.md#s7-2); the others are standard hub copies of the benchmarks.
DATASETS: dict[str, DatasetSpec] = {
    "dapo-math-17k-eng": DatasetSpec("math-dataset/DAPO-17k-Eng", "data/dapo-math-17k-eng.parquet", "math_dapo", True),
    "dapo-math-17k": DatasetSpec(
        "BytedTsinghua-SIA/DAPO-Math-17k", "data/dapo-math-17k-eng.parquet", "math_dapo", True
    ),
    "aime-2024": DatasetSpec("BytedTsinghua-SIA/AIME-2024", "data/aime-2024.parquet", "math_dapo", False),
    "aime-2025": DatasetSpec("math-ai/aime25", "data/aime-2025.parquet", "aime2025", False),
    "amc-2023": DatasetSpec("math-ai/amc23", "data/amc-2023.parquet", "amc_23", False),
    "minerva-math": DatasetSpec("math-ai/minervamath", "data/minerva-math.parquet", "minerva-math", False),
    "olympiadbench": DatasetSpec("math-ai/olympiadbench", "data/olympiadbench.parquet", "olympiadbench", False),
}
#: The generated tasks' dataset names: ``arith-`` + a task of rpg.data.tasks.
TASK_PREFIX = "arith-"
TASK_NAMES = tuple(TASK_PREFIX + t for t in tasks.TASKS)
DEFAULT_VAL_SIZE = 32

#: What ``all`` expands to (the unfiltered DAPO variant is an alternative source of the same file).
ALL = ("dapo-math-17k-eng", "aime-2024", "aime-2025", "amc-2023", "minerva-math", "olympiadbench")


class DataError(ValueError):
    """Bad input: the message names the file, row and field (or the valid choices)."""


@dataclass
class Summary:
    """Counts of one preparation run (printed as one line)."""

    name: str
    rows_in: int = 0
    duplicates: int = 0
    non_english: int = 0
    conflicting_answers: int = 0  # unique questions that appear with more than one answer
    unique: int = 0
    repeat: int = 1
    rows_out: int = 0
    output: str = ""

    def line(self) -> str:
        return (
            f"prepare_data: {self.name}: rows in {self.rows_in}, duplicates dropped {self.duplicates}, "
            f"non-English filtered {self.non_english}, unique {self.unique}"
            + (f", questions with >1 answer {self.conflicting_answers}" if self.conflicting_answers else "")
            + f", rows out {self.rows_out} ({self.unique} x {self.repeat}) -> {self.output}"
        )


# ----------------------------------------------------------------------------------------------------
# reading


def read_local(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a local ``.parquet`` or ``.jsonl`` file as dicts."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{path}: not a readable parquet file ({e})") from None
    if suffix in (".jsonl", ".json"):
        rows = []
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}: line {lineno}: not valid UTF-8 (byte {e.start + 1}); convert the file "
                                    "to UTF-8") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}: line {lineno}: expected a JSON object, got {type(row).__name__}")
                rows.append(row)
        return rows
    raise DataError(f"{path}: unsupported file type {suffix!r}; valid: .parquet, .jsonl")


def read_hub(hub_id: str, config: str | None = None, split: str | None = None) -> list[dict[str, Any]]:
    """Rows of a Hugging Face hub dataset (``datasets.load_dataset``); ``split=None`` takes the only split."""
    import datasets

    loaded = datasets.load_dataset(hub_id, name=config, split=split)
    if isinstance(loaded, datasets.DatasetDict):
        splits = sorted(loaded.keys())
        if len(splits) != 1:
            raise DataError(f"{hub_id}: several splits {splits}; choose one with --hub-split")
        loaded = loaded[splits[0]]
    return loaded.to_list()


# ----------------------------------------------------------------------------------------------------
# row normalisation


_NOT_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _text(value: Any, where: str, field: str, raw: bool = False) -> str | None:
    """A column value as a string, or None if missing or only whitespace. ``raw``: the text exactly as given
    (questions); else stripped of surrounding whitespace (answers).

    Text and finite numbers (and lists of them) only: NaN, infinities, booleans, dicts and other objects would be
    written as their Python spelling ("nan", "True", "{...}"), so they stop the run naming ``where`` and ``field``.
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        parts = [t for t in (_text(v, where, field) for v in value) if t]
        return ", ".join(parts) or None
    if isinstance(value, float) and not math.isfinite(value):
        raise DataError(f"{where}: {field!r} is {_NOT_FINITE[repr(value)]}; expected text or a finite number")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(f"{where}: {field!r} is a {type(value).__name__} ({value!r:.80}); expected text or a number")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value)
    if not text.strip():
        return None
    return text if raw else text.strip()


def _same(text: str) -> str:
    """The comparison key of a question: equal keys are the same problem (surrounding whitespace ignored)."""
    return text.strip()


def _answer_text(value: Any, where: str, field: str) -> str | None:
    text = _text(value, where, field)
    if text and len(text) >= 2 and text.startswith("$") and text.endswith("$") and text.count("$") == 2:
        text = text[1:-1].strip() or None
    return text


def _strip_template(content: str) -> str:
    if content.startswith(PRE) and content.endswith(POST):
        return content[len(PRE) : len(content) - len(POST)]
    return content


def _question_candidates(row: dict[str, Any], where: str) -> dict[str, str]:
    found = {}
    for col in QUESTION_COLUMNS:
        value = row.get(col)
        if col == "prompt" and isinstance(value, (list, tuple)):  # verl chat format
            users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
            value = _strip_template(users[-1]) if users and isinstance(users[-1], str) else None
        text = _text(value, where, col, raw=True)
        if text:
            found[col] = text
    return found


def _answer_candidates(row: dict[str, Any], where: str) -> dict[str, str]:
    found = {col: t for col in ANSWER_COLUMNS if (t := _answer_text(row.get(col), where, col))}
    reward_model = row.get("reward_model")
    truth = "reward_model.ground_truth"
    if isinstance(reward_model, dict) and (t := _answer_text(reward_model.get("ground_truth"), where, truth)):
        found[truth] = t
    return found


def _pick(found: dict[str, str], field: str, accepted: Sequence[str], where: str) -> str:
    if not found:
        raise DataError(f"{where}: missing field {field!r} (accepted columns: {', '.join(accepted)})")
    if len({_same(v) for v in found.values()}) > 1:
        raise DataError(f"{where}: ambiguous {field!r}: columns {sorted(found)} disagree; keep only one")
    return next(iter(found.values()))  # the first accepted column, as given


def extract(row: dict[str, Any], where: str) -> tuple[str, str]:
    """``(question, answer)`` of one input row; ``where`` (e.g. ``"f.jsonl: row 3"``) prefixes errors."""
    question = _pick(_question_candidates(row, where), "problem", QUESTION_COLUMNS, where)
    answer = _pick(_answer_candidates(row, where), "answer", (*ANSWER_COLUMNS, "reward_model.ground_truth"), where)
    return question, answer


def is_english(text: str) -> bool:
    """English-filter heuristic: no CJK character (``CJK_RE``)."""
    return CJK_RE.search(text) is None


# ----------------------------------------------------------------------------------------------------
# building


def make_row(question: str, answer: str, data_source: str, index: int) -> dict[str, Any]:
    """One verl RL row (docs/differences.md#s7-2) with the byte-exact prompt template (docs/differences.md#s7-3)."""
    return {
        "data_source": data_source,
        "prompt": [{"content": PRE + question + POST, "role": "user"}],
        "ability": ABILITY,
        "reward_model": {"ground_truth": answer, "style": REWARD_STYLE},
        "extra_info": {"index": index, "raw_problem": question, "split": None},
    }


def build_rows(
    rows: Iterable[dict[str, Any]],
    *,
    data_source: str,
    repeat: int | None,
    english_only: bool,
    origin: str = "input",
    name: str = "dataset",
) -> tuple[list[dict[str, Any]], Summary]:
    """Validate, de-duplicate, filter and (for eval sets) repeat the input rows.

    Args:
        rows: input records (see module docstring for accepted columns).
        data_source: value of the ``data_source`` column.
        repeat: ``None`` for a training set (``extra_info.index`` = row number); k >= 1 for an eval set
            (each unique problem written k times, ``extra_info.index`` = repeat index 0..k-1).
        english_only: drop rows whose question contains CJK characters.
        origin: file name / hub id used in error messages.

    Raises:
        DataError: on the first malformed row (1-based row number and field named).
    """
    if repeat is not None and repeat < 1:
        raise DataError(f"--repeat must be >= 1, got {repeat}")
    summary = Summary(name=name, repeat=repeat or 1)
    pairs: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    answers_by_question: dict[str, set[str]] = {}
    for rownum, row in enumerate(rows, 1):
        summary.rows_in += 1
        if not isinstance(row, dict):
            raise DataError(f"{origin}: row {rownum}: expected a record, got {type(row).__name__}")
        question, answer = extract(row, f"{origin}: row {rownum}")
        if english_only and not is_english(question):
            summary.non_english += 1
            continue
        key = (_same(question), answer)
        if key in seen:
            summary.duplicates += 1
            continue
        seen.add(key)
        answers_by_question.setdefault(key[0], set()).add(answer)
        pairs.append((question, answer))
    summary.unique = len(pairs)
    summary.conflicting_answers = sum(len(a) > 1 for a in answers_by_question.values())
    if repeat is None:
        out = [make_row(q, a, data_source, i) for i, (q, a) in enumerate(pairs)]
    else:
        out = [make_row(q, a, data_source, r) for q, a in pairs for r in range(repeat)]
    summary.rows_out = len(out)
    return out, summary


def write_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> None:
    """Write rows atomically (``rpg.atomic.atomic_path``: no partial file, no temp file left on errors)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise DataError(f"{path}: nothing to write (0 rows after filtering)")
    table = pa.Table.from_pylist(rows)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def check_data_source(data_source: str) -> None:
    """Fail early if neither ``rpg.data.reward`` nor verl's ``default_compute_score`` can score the source
    (docs/differences.md#d17: e.g. ``math-dapo`` with a hyphen)."""
    if scorer_for(data_source) is not None:
        return
    from verl.utils.reward_score import default_compute_score

    try:
        default_compute_score(data_source, "Answer: 0", "0")
    except NotImplementedError:
        valid = sorted(MATH_DAPO_SOURCES | MATH_VERIFY_SOURCES) + [f"{p}*" for p in MATH_DAPO_PREFIXES]
        raise DataError(
            f"data_source {data_source!r} has no scorer in rpg.data.reward nor verl's default_compute_score; "
            f"valid choices include: {', '.join(valid)}"
        ) from None


def prepare(
    name: str,
    *,
    source: str | None = None,
    hub_id: str | None = None,
    hub_config: str | None = None,
    hub_split: str | None = None,
    output: str | None = None,
    data_source: str | None = None,
    repeat: int | None = DEFAULT_REPEAT,
    english_only: bool | None = None,
) -> Summary:
    """Prepare one dataset (``name`` in ``DATASETS``) and write its parquet; returns the counts.

    ``repeat`` applies to eval sets only; ``english_only`` defaults to True for training sets.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; valid: {', '.join([*DATASETS, *TASK_NAMES, 'all'])}")
    spec = DATASETS[name]
    if data_source is not None:
        check_data_source(data_source)
    if source is not None:
        origin, rows = source, read_local(source)
    else:
        origin = hub_id or spec.hub_id
        rows = read_hub(origin, hub_config or spec.hub_config, hub_split or spec.hub_split)
    out_rows, summary = build_rows(
        rows,
        data_source=data_source or spec.data_source,
        repeat=None if spec.train else repeat,
        english_only=spec.train if english_only is None else english_only,
        origin=origin,
        name=name,
    )
    summary.output = output or spec.output
    write_parquet(out_rows, summary.output)
    return summary


def task_row(question: str, answer: int, split: str, index: int) -> dict[str, Any]:
    """One verl RL row of a generated task: the bare question as the user message, scored by its last number."""
    return {
        "data_source": LAST_NUMBER_SOURCE,
        "prompt": [{"content": question, "role": "user"}],
        "ability": ABILITY,
        "reward_model": {"ground_truth": str(answer), "style": "rule"},
        "extra_info": {"index": index, "raw_problem": question, "split": split},
    }


def prepare_task(name: str, *, seed: int, val_size: int, train_size: int | None, out_dir: str) -> str:
    """Write the seeded train/validation split of a generated task (``arith-<task>``); returns the summary line."""
    task = name[len(TASK_PREFIX):]
    try:
        train, val = tasks.split(task, seed, val_size, train_size)
    except tasks.TaskError as e:
        raise DataError(str(e)) from None
    folder = Path(out_dir) / name
    for split, problems in (("train", train), ("val", val)):
        write_parquet([task_row(q, a, split, i) for i, (q, a) in enumerate(problems)], folder / f"{split}.parquet")
    return (f"prepare_data: {name}: {len(tasks.problems(task))} problems, seed {seed}: train {len(train)}, "
            f"validation {len(val)} (disjoint) -> {folder}/train.parquet, {folder}/val.parquet")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rpg-prepare-data",
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "datasets", nargs="+", metavar="DATASET", help=f"one or more of: {', '.join([*DATASETS, *TASK_NAMES])}, all"
    )
    parser.add_argument("--source", help="local .parquet/.jsonl instead of the hub (single dataset only)")
    parser.add_argument("--hub-id", help="override the hub dataset id (single dataset only)")
    parser.add_argument("--hub-config", help="hub dataset config name")
    parser.add_argument("--hub-split", help="hub split (default: the dataset's only split)")
    parser.add_argument("--out", help="output parquet path (single dataset only; default data/<name>.parquet)")
    parser.add_argument("--out-dir", default=None, help="directory for the default output file names")
    parser.add_argument("--data-source", help="override the data_source column (single dataset only)")
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="copies per eval problem, k of mean@k (default 32)"
    )
    parser.add_argument(
        "--english-filter", choices=("auto", "on", "off"), default="auto",
        help="drop questions with CJK characters (auto: on for training sets only)",
    )
    parser.add_argument("--seed", type=int, default=0, help="arith-*: the seed of the train/validation split")
    parser.add_argument("--val-size", type=int, default=DEFAULT_VAL_SIZE, help="arith-*: validation problems")
    parser.add_argument("--train-size", type=int, default=None, help="arith-*: training problems (default: the rest)")
    args = parser.parse_args(argv)

    names = [n for d in args.datasets for n in (ALL if d == "all" else (d,))]
    single_only = {
        "--source": args.source, "--hub-id": args.hub_id, "--out": args.out, "--data-source": args.data_source
    }
    try:
        with sigterm_exits():  # SIGTERM, like Ctrl-C, leaves no temporary file behind
            for flag, value in single_only.items():
                if value is not None and len(names) != 1:
                    raise DataError(f"{flag} needs exactly one dataset, got {names}")
            for name in names:
                if name in TASK_NAMES:
                    print(prepare_task(name, seed=args.seed, val_size=args.val_size, train_size=args.train_size,
                                       out_dir=args.out_dir or "data"))
                    continue
                output = args.out
                if output is None and args.out_dir is not None and name in DATASETS:
                    output = str(Path(args.out_dir) / Path(DATASETS[name].output).name)
                summary = prepare(
                    name, source=args.source, hub_id=args.hub_id, hub_config=args.hub_config, hub_split=args.hub_split,
                    output=output, data_source=args.data_source, repeat=args.repeat,
                    english_only={"auto": None, "on": True, "off": False}[args.english_filter],
                )
                print(summary.line())
    except DataError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prepare_data: interrupted; nothing partial was written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
