"""rpg.tools.prepare_data: schema and byte-exact template (docs/differences.md#s7-2, #s7-3), k-repetition, dedup,
English filter, malformed input, atomic and re-runnable writes."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

# Hand-written (not built with the module's constants) so that a template change fails the test.
EXPECTED_CONTENT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "Find the number of ordered pairs $(x, y)$ with $x + y = 10$.\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)

AIME_ROWS = [
    {"id": 1, "problem": "Find the number of ordered pairs $(x, y)$ with $x + y = 10$.", "answer": 11, "solution": "..."},
    {"id": 2, "problem": "Compute $2^{10}$.", "answer": "1024"},
    {"id": 1, "problem": "Find the number of ordered pairs $(x, y)$ with $x + y = 10$.", "answer": 11, "solution": "..."},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_aime_style_file_byte_exact_rows(prepare_data, tmp_path, capsys):
    src = write_jsonl(tmp_path / "aime.jsonl", AIME_ROWS)
    out = tmp_path / "out" / "aime-2025.parquet"
    assert prepare_data.main(["aime-2025", "--source", str(src), "--out", str(out), "--repeat", "3"]) == 0
    rows = pq.read_table(out).to_pylist()
    assert pq.read_table(out).column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert rows[0] == {
        "data_source": "aime2025",
        "prompt": [{"content": EXPECTED_CONTENT, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "11", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": 0, "raw_problem": "Find the number of ordered pairs $(x, y)$ with $x + y = 10$.",
                       "split": None},
    }
    # k copies per unique problem, index = repeat index, problem-major order
    assert len(rows) == 2 * 3
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["11"] * 3 + ["1024"] * 3
    assert all(r["prompt"] == rows[0]["prompt"] for r in rows[:3])
    line = capsys.readouterr().out
    assert "rows in 3, duplicates dropped 1" in line and "rows out 6 (2 x 3)" in line


def test_rerun_is_byte_identical(prepare_data, tmp_path):
    src = write_jsonl(tmp_path / "aime.jsonl", AIME_ROWS)
    out = tmp_path / "a.parquet"
    prepare_data.prepare("amc-2023", source=str(src), output=str(out), repeat=32)
    first = out.read_bytes()
    prepare_data.prepare("amc-2023", source=str(src), output=str(out), repeat=32)
    assert out.read_bytes() == first
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 64 and {r["data_source"] for r in rows} == {"amc_23"}
    assert sorted({r["extra_info"]["index"] for r in rows}) == list(range(32))
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_malformed_row_names_row_and_field_and_writes_nothing(prepare_data, tmp_path, capsys):
    rows = [dict(r) for r in AIME_ROWS]
    del rows[2]["answer"]  # row 3 has no answer column
    src = write_jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "bad.parquet"
    with pytest.raises(prepare_data.DataError, match=r"bad\.jsonl: row 3: missing field 'answer'"):
        prepare_data.prepare("aime-2025", source=str(src), output=str(out))
    assert not out.exists()
    # the CLI reports it on stderr with exit code 2, still writing nothing
    assert prepare_data.main(["aime-2025", "--source", str(src), "--out", str(out)]) == 2
    assert "row 3: missing field 'answer'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["bad.jsonl"]


# An AMC-2023-style problem whose raw text ends in a space, and one with a leading newline, a tab and double spaces.
RAW_TRAILING_SPACE = "How many positive integers $n$ satisfy $n^2 < 50$? "
RAW_WHITESPACE = "\n  Let $f(x) = x^2$.\tCompute  $f(3)$.\n"


def test_raw_problem_text_is_kept_byte_for_byte(prepare_data, tmp_path):
    """The prompt is PRE + the raw problem + POST with no whitespace normalisation (the authors' files keep the text
    as given), and the tool rebuilds the same file from its own output (verl schema in, raw text recovered)."""
    src = write_jsonl(tmp_path / "amc.jsonl", [{"problem": RAW_TRAILING_SPACE, "answer": "7"},
                                               {"problem": RAW_WHITESPACE, "answer": 9}])
    out = tmp_path / "amc-2023.parquet"
    prepare_data.prepare("amc-2023", source=str(src), output=str(out), repeat=2)
    rows = pq.read_table(out).to_pylist()
    # hand-written expected bytes: "...answer to the problem.\n\n" + raw + "\n\nRemember..."
    assert rows[0]["prompt"][0]["content"] == (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
        "How many positive integers $n$ satisfy $n^2 < 50$? \n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    assert [r["extra_info"]["raw_problem"] for r in rows] == [RAW_TRAILING_SPACE] * 2 + [RAW_WHITESPACE] * 2
    assert rows[2]["prompt"][0]["content"] == prepare_data.PRE + RAW_WHITESPACE + prepare_data.POST
    # round trip: the written file as input (templated prompts) gives back the raw problems and the same bytes
    again = tmp_path / "again.parquet"
    prepare_data.prepare("amc-2023", source=str(out), output=str(again), repeat=2)
    assert pq.read_table(again).to_pylist() == rows
    # (the 2 x 2 input rows are 2 problems: duplicates are dropped before repeating)
    assert again.read_bytes() == out.read_bytes()


def test_dedup_compares_stripped_text_but_keeps_the_raw_text(prepare_data, tmp_path):
    rows = [{"problem": RAW_TRAILING_SPACE, "answer": "7"},
            {"problem": RAW_TRAILING_SPACE.strip(), "answer": "7"},  # same problem up to whitespace: a duplicate
            {"problem": "\t" + RAW_TRAILING_SPACE.strip(), "answer": "8"},  # same problem, another answer
            {"problem": "  \n", "answer": "1"}]  # whitespace only: no problem
    src = write_jsonl(tmp_path / "train.jsonl", rows[:3])
    out = tmp_path / "train.parquet"
    summary = prepare_data.prepare("dapo-math-17k", source=str(src), output=str(out))
    assert (summary.duplicates, summary.unique, summary.conflicting_answers) == (1, 2, 1)
    got = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["raw_problem"] for r in got] == [RAW_TRAILING_SPACE, "\t" + RAW_TRAILING_SPACE.strip()]
    with pytest.raises(prepare_data.DataError, match=r"row 1: missing field 'problem'"):
        prepare_data.extract(rows[3], "row 1")
    # two question columns equal up to whitespace are not ambiguous; the first accepted column's raw text is kept
    assert prepare_data.extract({"problem": "Q ", "question": "Q", "answer": "1"}, "r") == ("Q ", "1")


def test_ambiguous_and_invalid_inputs(prepare_data, tmp_path):
    src = write_jsonl(tmp_path / "amb.jsonl", [{"problem": "A", "question": "B", "answer": "1"}])
    with pytest.raises(prepare_data.DataError, match=r"row 1: ambiguous 'problem'"):
        prepare_data.prepare("aime-2025", source=str(src), output=str(tmp_path / "x.parquet"))
    src = write_jsonl(tmp_path / "sol.jsonl", [{"problem": "A", "solution": "the answer is 1"}])
    with pytest.raises(prepare_data.DataError, match="missing field 'answer'"):  # solution is not an answer
        prepare_data.prepare("aime-2025", source=str(src), output=str(tmp_path / "x.parquet"))
    with pytest.raises(prepare_data.DataError, match="unknown dataset 'aime24'; valid: dapo-math-17k-eng"):
        prepare_data.prepare("aime24", source=str(src))
    with pytest.raises(prepare_data.DataError, match="math-dapo.*valid choices include: .*math_dapo"):
        prepare_data.prepare("aime-2024", source=str(src), data_source="math-dapo")  # docs/differences.md#d17


def test_training_set_dedup_english_filter_and_verl_schema_input(prepare_data, tmp_path, capsys):
    """An unfiltered-DAPO-like parquet in verl's own schema (templated prompt, reward_model.ground_truth),
    each prompt repeated, some Chinese: de-duplicated, filtered, template not applied twice."""
    pre, post = prepare_data.PRE, prepare_data.POST

    def dapo_row(question, answer):
        return {
            "data_source": "math_dapo",
            "prompt": [{"content": pre + question + post, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": "some-uuid"},
        }

    unique = [("What is $1+1$?", "2"), ("求 $2+2$ 的值。", "4"), ("Evaluate $3 \\cdot 3$.", "9"), ("What is $1+1$?", "3")]
    rows = [dapo_row(q, a) for _ in range(5) for q, a in unique]  # 20 rows, each pair 5 times
    import pyarrow as pa

    src = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    out = tmp_path / "train.parquet"
    summary = prepare_data.prepare("dapo-math-17k", source=str(src), output=str(out))
    assert (summary.rows_in, summary.non_english, summary.duplicates, summary.unique, summary.rows_out) == (20, 5, 12, 3, 3)
    assert summary.conflicting_answers == 1  # "What is $1+1$?" appears with answers 2 and 3
    got = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["index"] for r in got] == [0, 1, 2]
    assert [r["extra_info"]["raw_problem"] for r in got] == ["What is $1+1$?", "Evaluate $3 \\cdot 3$.", "What is $1+1$?"]
    assert got[1]["prompt"][0]["content"] == pre + "Evaluate $3 \\cdot 3$." + post
    assert {r["data_source"] for r in got} == {"math_dapo"}


def test_answer_normalisation(prepare_data):
    extract = prepare_data.extract
    assert extract({"Problem": "q", "Answer": 540.0}, "r") == ("q", "540")
    assert extract({"question": "q", "final_answer": ["$\\frac{1}{2}$"]}, "r") == ("q", "\\frac{1}{2}")
    assert extract({"question": "q", "final_answer": ["1", "2"]}, "r") == ("q", "1, 2")
    assert prepare_data.is_english("Find $x$ such that x² = 4 — naïve café")
    assert not prepare_data.is_english("已知 $x=1$")


def test_cli_help_lists_datasets(prepare_data, capsys):
    with pytest.raises(SystemExit) as exc:
        prepare_data.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name in ("aime-2024", "aime-2025", "amc-2023", "minerva-math", "olympiadbench", "dapo-math-17k-eng"):
        assert name in text


def test_output_loads_in_verl_rlhf_dataset(prepare_data, tmp_path, tiny_tokenizer):
    """The file is consumed by verl's own RLHFDataset (the trainer's loader) with the chat template."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    src = write_jsonl(tmp_path / "aime.jsonl", AIME_ROWS)
    out = tmp_path / "aime.parquet"
    prepare_data.prepare("aime-2024", source=str(src), output=str(out), repeat=2)
    config = OmegaConf.create({"max_prompt_length": 512, "truncation": "error", "filter_overlong_prompts": False,
                               "prompt_key": "prompt", "return_raw_chat": True})
    dataset = RLHFDataset(data_files=[str(out)], tokenizer=tiny_tokenizer, config=config)
    assert len(dataset) == 4
    item = dataset[0]
    assert item["data_source"] == "math_dapo"
    assert item["reward_model"]["ground_truth"] == "11"
    assert list(item["raw_prompt"])[0]["content"] == EXPECTED_CONTENT


def test_hub_path_uses_datasets_load_dataset(prepare_data, tmp_path, monkeypatch):
    """The hub branch calls datasets.load_dataset(hub_id, name=..., split=...) (stubbed: no network) and
    takes the only split, or asks for --hub-split naming the choices."""
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        table = datasets.Dataset.from_list([{"question": "Compute $1+2$.", "answer": "3"}])
        return table if split else datasets.DatasetDict({"test": table} if path != "two/splits" else {"a": table, "b": table})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    out = tmp_path / "minerva.parquet"
    summary = prepare_data.prepare("minerva-math", output=str(out), repeat=2)
    assert calls == [("math-ai/minervamath", None, None)] and summary.rows_out == 2
    assert {r["data_source"] for r in pq.read_table(out).to_pylist()} == {"minerva-math"}
    with pytest.raises(prepare_data.DataError, match=r"several splits \['a', 'b'\]; choose one with --hub-split"):
        prepare_data.prepare("olympiadbench", hub_id="two/splits", output=str(tmp_path / "o.parquet"))
    prepare_data.prepare("olympiadbench", hub_id="two/splits", hub_split="b", output=str(tmp_path / "o.parquet"))
    assert calls[-1] == ("two/splits", None, "b")
    assert prepare_data.main(["all", "--source", "x.jsonl"]) == 2  # --source needs exactly one dataset


# ----------------------------------------------------------------------------------------------------------------------
# Nothing is lost or silently mangled: bad answer types, bad encodings, interrupted writes, file modes
# ----------------------------------------------------------------------------------------------------------------------
BAD_VALUES = [  # (JSONL text of the answer, what the message must name)
    ("NaN", "NaN"),
    ("Infinity", "Infinity"),
    ("-Infinity", "-Infinity"),
    ("true", "bool"),
    ('{"value": 3}', "dict"),
    ('["1", false]', "bool"),
]


@pytest.mark.parametrize("answer, needle", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_answers_that_are_not_text_or_finite_numbers_are_refused(prepare_data, tmp_path, capsys, answer, needle):
    src = tmp_path / "odd.jsonl"
    good, bad = '{"problem": "Compute 1+1.", "answer": "2"}', f'{{"problem": "Compute 2+2.", "answer": {answer}}}'
    src.write_text(f"{good}\n{bad}\n")
    out = tmp_path / "odd.parquet"
    assert prepare_data.main(["aime-2025", "--source", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{src}: row 2: " in err and "'answer'" in err and needle in err, err
    assert not out.exists()


def test_question_that_is_not_text_is_refused(prepare_data, tmp_path):
    src = tmp_path / "q.jsonl"
    src.write_text('{"problem": {"text": "Compute 1+1."}, "answer": "2"}\n')
    with pytest.raises(prepare_data.DataError, match=r"q\.jsonl: row 1: 'problem'.*dict"):
        prepare_data.prepare("aime-2025", source=str(src), output=str(tmp_path / "q.parquet"))


def test_non_utf8_input_is_a_message_naming_file_and_line(prepare_data, tmp_path, capsys):
    src = tmp_path / "latin1.jsonl"
    src.write_bytes(b'{"problem": "ok", "answer": "1"}\n{"problem": "caf\xe9", "answer": "2"}\n')
    out = tmp_path / "x.parquet"
    assert prepare_data.main(["aime-2025", "--source", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{src}: line 2: not valid UTF-8" in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_output_mode_follows_the_umask(prepare_data, tmp_path, mask, mode):
    src = write_jsonl(tmp_path / "aime.jsonl", AIME_ROWS)
    old = os.umask(mask)
    try:
        prepare_data.prepare("aime-2025", source=str(src), output=str(tmp_path / "a.parquet"), repeat=1)
    finally:
        os.umask(old)
    assert (tmp_path / "a.parquet").stat().st_mode & 0o777 == mode


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_interrupted_write_leaves_no_temp_file_and_no_output(tmp_path, signum):
    """A real signal while the parquet file is being written (the writer is slowed down in the child process)."""
    import signal
    import subprocess
    import sys
    import textwrap

    src = write_jsonl(tmp_path / "aime.jsonl", AIME_ROWS)
    out = tmp_path / "out" / "aime.parquet"
    child = textwrap.dedent(
        f"""
        import signal, sys, time
        import pyarrow.parquet as pq
        from rpg.tools import prepare_data

        # Ctrl-C as in a terminal: a process started in the background by a non-interactive shell (CI's
        # `cmd &`) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
        signal.signal(signal.SIGINT, signal.default_int_handler)

        write_table = pq.write_table
        def slow_write_table(table, where, **kwargs):
            write_table(table, where, **kwargs)
            print("written", flush=True)
            time.sleep(60)
        pq.write_table = slow_write_table
        sys.exit(prepare_data.main(["aime-2025", "--source", {str(src)!r}, "--out", {str(out)!r}]))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written", proc.stderr.read()
    proc.send_signal(getattr(signal, signum))
    rc = proc.wait(timeout=300)
    assert rc == {"SIGINT": 130, "SIGTERM": 143}[signum], proc.stderr.read()
    assert list(out.parent.iterdir()) == []
