"""rpg.tools.report: Last/Best table (values and steps hand-computed) and curve PNG from synthetic runs in
every supported format: verl console log, verl file-logger JSONL, wandb offline run directory."""

from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

AIME = "val-core/aime2025/acc/mean@1"
DAPO = "val-core/math_dapo/acc/mean@1"

# run A (console): validation at steps 0, 2, 4
A_VAL = {0: {AIME: 0.20, DAPO: 0.50}, 2: {AIME: 0.35, DAPO: 0.50}, 4: {AIME: 0.30, DAPO: 0.60}}
# run B (file logger): val_kwargs.n=32 layout has mean@32 next to the aux mean@1; math_dapo has a tie
B_VAL = {
    0: {"val-core/aime2025/acc/mean@32": 0.10, "val-aux/aime2025/acc/mean@1": 0.9, DAPO: 0.40},
    2: {"val-core/aime2025/acc/mean@32": 0.25, DAPO: 0.70},
    4: {"val-core/aime2025/acc/mean@32": 0.15, DAPO: 0.70},
}
# run C (wandb offline): only aime2025
C_VAL = {0: {AIME: 0.05}, 3: {AIME: 0.45}, 6: {AIME: 0.40}}


def train_metrics(step: int) -> dict[str, float]:
    return {"critic/score/mean": -1 + 0.1 * step, "actor/entropy": 1.0 - 0.05 * step, "response_length/mean": 20.0 + step}


def history(val: dict[int, dict[str, float]], steps: range) -> dict[int, dict[str, float]]:
    """verl logs validation at step 0 alone, later merged into the training step's record."""
    out = {0: dict(val.get(0, {}))}
    for step in steps:
        out[step] = {**train_metrics(step), **val.get(step, {})}
    return out


def write_console_log(path, hist):
    """Lines exactly as verl's console logger prints them (``concat_dict_to_str``), with numpy scalars
    (printed as ``np.float64(..)``), Ray's pid prefix and a progress bar sharing a line via \\r."""
    import numpy as np
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    lines = ["(TaskRunnerV1 pid=123) Initial validation metrics: {...}"]
    for step, metrics in hist.items():
        mixed = {k: (np.float64(v) if i % 2 else v) for i, (k, v) in enumerate(metrics.items())}
        lines.append("(TaskRunnerV1 pid=123) " + concat_dict_to_str(mixed, step=step))
        lines.append(f"Training Progress:  {step * 20}%|##   | {step}/5 [00:01<00:04]\rnoise line")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_file_logger(path, hist, monkeypatch_env):
    """Through verl's own FileLogger (``trainer.logger=[file]``)."""
    from verl.utils.tracking import FileLogger

    monkeypatch_env.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger("project", "experiment")
    for step, metrics in hist.items():
        logger.log(metrics, step)
    logger.finish()


WANDB_SCRIPT = textwrap.dedent(
    """
    import json, sys, wandb
    hist = {int(k): v for k, v in json.loads(sys.argv[2]).items()}
    run = wandb.init(project="p", name="run-c", dir=sys.argv[1], mode="offline")
    for step in sorted(hist):
        wandb.log(hist[step], step=step)
    run.finish()
    """
)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    write_console_log(root / "run_a.log", history(A_VAL, range(1, 5)))
    with pytest.MonkeyPatch.context() as mp:
        write_file_logger(root / "run_b.jsonl", history(B_VAL, range(1, 5)), mp)
    pytest.importorskip("wandb")
    (root / "c").mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    subprocess.run(
        [sys.executable, "-c", WANDB_SCRIPT, str(root / "c"), json.dumps(history(C_VAL, range(1, 7)))],
        check=True, env=env, timeout=120, capture_output=True,
    )
    return root


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_readers_parse_every_format(report, runs_dir):
    runs = {r.name: r for r in report.load_runs([str(runs_dir / "run_a.log"), f"B={runs_dir / 'run_b.jsonl'}", str(runs_dir / "c")])}
    assert set(runs) == {"run_a", "B", "run-c"}
    for run, val, last in ((runs["run_a"], A_VAL, 4), (runs["B"], B_VAL, 4), (runs["run-c"], C_VAL, 6)):
        assert sorted(run.history) == list(range(last + 1))
        for step, metrics in val.items():
            for key, value in metrics.items():
                assert run.history[step][key] == pytest.approx(value), (run.name, step, key)
        assert run.series("actor/entropy") == [(s, pytest.approx(1.0 - 0.05 * s)) for s in range(1, last + 1)]


def test_last_best_table(report, runs_dir, tmp_path):
    out = tmp_path / "report"
    assert report.main([f"A={runs_dir / 'run_a.log'}", f"B={runs_dir / 'run_b.jsonl'}", f"C={runs_dir / 'c'}", "--out", str(out)]) == 0
    rows = {(r["run"], r["source"]): r for r in csv.DictReader(open(out / "table.csv", encoding="utf-8"))}
    expected = {  # (metric, last, last_step, best, best_step), computed by hand from the dicts above
        ("A", "aime2025"): (AIME, 0.30, 4, 0.35, 2),
        ("A", "math_dapo"): (DAPO, 0.60, 4, 0.60, 4),
        ("B", "aime2025"): ("val-core/aime2025/acc/mean@32", 0.15, 4, 0.25, 2),
        ("B", "math_dapo"): (DAPO, 0.70, 4, 0.70, 2),  # tie: earliest step
        ("C", "aime2025"): (AIME, 0.40, 6, 0.45, 3),
    }
    assert set(rows) == set(expected)
    for key, (metric, last, last_step, best, best_step) in expected.items():
        row = rows[key]
        assert row["metric"] == metric
        assert float(row["last"]) == pytest.approx(last) and int(row["last_step"]) == last_step
        assert float(row["best"]) == pytest.approx(best) and int(row["best_step"]) == best_step

    md = (out / "table.md").read_text(encoding="utf-8").splitlines()
    assert md[0] == "| Run | aime2025 Last | aime2025 Best | math_dapo Last | math_dapo Best |"
    assert md[2] == "| A | 0.3000 (step 4) | 0.3500 (step 2) | 0.6000 (step 4) | 0.6000 (step 4) |"
    assert md[4] == "| C | 0.4000 (step 6) | 0.4500 (step 3) | – | – |"

    # 2 accuracy panels + reward, entropy, length = 5 panels -> 4 x 2 grid of 400 x 300 px
    assert png_size((out / "curves.png").read_bytes()) == (1600, 600)
    assert sorted(os.listdir(out)) == ["curves.png", "table.csv", "table.md"]


def test_explicit_k_and_prefix(report, runs_dir):
    runs = report.load_runs([f"B={runs_dir / 'run_b.jsonl'}"])
    sources, table = report.build_table(runs, "val-core", k=1)
    assert sources == ["math_dapo"]  # aime2025 has no val-core mean@1 in run B
    sources, table = report.build_table(runs, "val-aux", k=None)
    assert table["B"]["aime2025"] == report.Cell("val-aux/aime2025/acc/mean@1", 0.9, 0, 0.9, 0)


def test_toy_single_run_figure_size(report, tmp_path):
    """The CPU demo's case: one console log, one source (val-core/math_dapo/acc/mean@1)."""
    write_console_log(tmp_path / "demo.log", history({0: {DAPO: 0.3}, 2: {DAPO: 0.4}}, range(1, 3)))
    paths = report.report([str(tmp_path / "demo.log")], tmp_path / "out")
    assert png_size(paths["curves.png"].read_bytes()) == (1600, 300)  # 1 + 3 panels in one row
    assert "| demo | 0.4000 (step 2) | 0.4000 (step 2) |" in paths["table.md"].read_text(encoding="utf-8")


def test_rpg_runs_get_the_diagnostics_panel(report, tmp_path):
    """A run logging RPG's metrics (the names rpg.losses logs) gets diagnostics.png (KL, kl_adv_rel, the top-k KL's
    kl_share, 5 branch fractions: 8 panels, 4 × 2 of 400 × 300 px) and diagnostics.md (last / mean per metric, by hand
    below; "—" for a metric the run does not log)."""
    from rpg.losses import BRANCHES

    assert report.RPG_BRANCHES == BRANCHES
    fractions = dict(zip(BRANCHES, (0.5, 0.1, 0.05, 0.3, 0.05)))
    hist = history({0: {DAPO: 0.3}, 2: {DAPO: 0.4}}, range(1, 3))
    for step in (1, 2):
        hist[step] |= {"actor/rpg/kl": 1e-3 * step, "actor/rpg/kl_adv_rel": 2e-4 * step}
        hist[step] |= {f"actor/rpg/frac_{b}": f for b, f in fractions.items()}
    write_console_log(tmp_path / "rpg.log", hist)
    paths = report.report([str(tmp_path / "rpg.log")], tmp_path / "out")
    assert png_size(paths["diagnostics.png"].read_bytes()) == (1600, 600)
    md = paths["diagnostics.md"].read_text(encoding="utf-8").splitlines()
    assert md[0].startswith("| run | steps | kl last / mean | kl_adv_rel last / mean | kl_share last / mean | "
                            "frac_pos_grad last / mean |")
    assert md[2] == "| rpg | 2 | 0.002 / 0.0015 | 0.0004 / 0.0003 | — | 0.5 / 0.5 | 0.1 / 0.1 | 0.05 / 0.05 | 0.3 / 0.3 | 0.05 / 0.05 |"
    hist[1] |= {"actor/rpg/kl_share": 0.25}
    hist[2] |= {"actor/rpg/kl_share": 0.75}
    write_console_log(tmp_path / "topk.log", hist)
    md = report.report([str(tmp_path / "topk.log")], tmp_path / "topk")["diagnostics.md"].read_text(encoding="utf-8")
    assert "| 0.0004 / 0.0003 | 0.75 / 0.5 | 0.5 / 0.5 |" in md
    # a run of verl's own losses logs none of them: no diagnostics files (test_last_best_table lists the outputs)
    assert not report.has_rpg_metrics(report.load_runs([str(tmp_path / "rpg.log")])[:0])


def test_bad_inputs(report, tmp_path, capsys):
    with pytest.raises(report.ReportError, match="no such file"):
        report.load_runs([str(tmp_path / "missing.log")])
    (tmp_path / "empty.log").write_text("nothing here\n")
    with pytest.raises(report.ReportError, match="no metric records"):
        report.load_runs([str(tmp_path / "empty.log")])
    (tmp_path / "bad.jsonl").write_text('{"step": 1}\n')
    assert report.main([str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "line 1: not a verl file-logger record" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    (tmp_path / "live.jsonl").write_text('{"step": 1, "data": {"a": 1}}\n{"step": 2, "da')  # run still writing
    assert report.load_runs([str(tmp_path / "live.jsonl")])[0].history == {1: {"a": 1.0}}
    (tmp_path / "x.wandb").write_bytes(b"garbage")
    with pytest.raises(report.ReportError, match="not a wandb transaction log"):
        report.load_runs([str(tmp_path / "x.wandb")])
    with pytest.raises(SystemExit) as exc:
        report.main(["a.log", "--out", "o", "--k", "0"])
    assert exc.value.code == 2  # argparse's usage error, naming the option, the value and the valid choices
    assert "--k must be 'auto' or a positive integer, got '0'" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------------
# Bad inputs never cost the results of the good runs
# ----------------------------------------------------------------------------------------------------------------------
WRONG_TYPES = {  # JSONL file-logger lines that parse as JSON but are not a usable record
    "data_list.jsonl": '{"step": 1, "data": [0.5]}\n',
    "step_text.jsonl": '{"step": "one", "data": {"a": 1}}\n',
    "step_null.jsonl": '{"step": null, "data": {"a": 1}}\n',
    "step_fraction.jsonl": '{"step": 1.5, "data": {"a": 1}}\n',
    "step_bool.jsonl": '{"step": true, "data": {"a": 1}}\n',
}


@pytest.mark.parametrize("name", sorted(WRONG_TYPES))
def test_wrong_record_types_name_the_file_and_line(report, tmp_path, name):
    path = tmp_path / name
    path.write_text('{"step": 0, "data": {"a": 0}}\n' + WRONG_TYPES[name])
    with pytest.raises(report.ReportError, match=rf"{name}: line 2: "):
        report.load_runs([str(path)])


def test_values_of_the_wrong_type_are_skipped_not_fatal(report, tmp_path):
    path = tmp_path / "values.jsonl"
    huge = "9" * 400  # a JSON integer too large for a float
    path.write_text(f'{{"step": 1, "data": {{"ok": 0.5, "text": "0.7", "list": [1], "dict": {{"a": 1}}, "null": null, '
                    f'"huge": {huge}, "flag": true}}}}\n')  # fmt: skip
    (run,) = report.load_runs([str(path)])
    assert run.history == {1: {"ok": 0.5, "flag": 1.0}}


def _truncated_wandb_run(runs_dir, tmp_path, cut):
    """A copy of run C whose .wandb file is cut after ``cut(data)`` bytes."""
    import shutil

    copy = tmp_path / "c_truncated"
    shutil.copytree(runs_dir / "c", copy, symlinks=True)
    (log,) = {p.resolve() for p in copy.rglob("*.wandb")}  # wandb/latest-run links to the run folder
    data = log.read_bytes()
    log.write_bytes(data[: cut(data)])
    return copy, log


def _record_starts(data: bytes) -> list[int]:
    """Byte offsets of the records of a small (one 32 KiB block) wandb log: 7-byte file header, then records of a
    7-byte header (crc u32, length u16, type u8) and the payload."""
    assert len(data) < 32 * 1024
    starts, pos = [], 7
    while pos + 7 <= len(data) and any(data[pos : pos + 7]):
        starts.append(pos)
        pos += 7 + struct.unpack_from("<H", data, pos + 4)[0]
    return starts


CUTS = {  # where a killed run may stop: inside a record header, inside a payload, one byte short of the end
    "header": lambda d: _record_starts(d)[len(_record_starts(d)) // 2] + 3,
    "payload": lambda d: _record_starts(d)[len(_record_starts(d)) // 2] + 7 + 1,
    "last_byte": lambda d: len(d) - 1,
}


@pytest.mark.parametrize("where", sorted(CUTS))
def test_truncated_wandb_file_keeps_its_complete_records(report, runs_dir, tmp_path, where):
    """A run killed mid-write: the records before the cut are used, with a message naming the file."""
    (full,) = report.load_runs([str(runs_dir / "c")])
    copy, log = _truncated_wandb_run(runs_dir, tmp_path, CUTS[where])
    problems: list[str] = []
    (run,) = report.load_runs([str(copy)], problems=problems)
    assert run.history and all(run.history[s] == full.history[s] for s in run.history)  # a prefix, nothing made up
    assert len(problems) == 1 and problems[0].startswith(f"{log}: truncated at byte "), problems
    with pytest.raises(report.ReportError, match="truncated"):  # without a problems list: an error
        report.load_runs([str(copy)])


def test_bad_runs_are_reported_and_the_good_ones_still_written(report, runs_dir, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "empty.jsonl").write_text("")
    (bad / "empty.log").write_text("")
    (bad / "empty.wandb").write_bytes(b"")
    (bad / "types.jsonl").write_text('{"step": "one", "data": {"a": 1}}\n')
    cut, cut_log = _truncated_wandb_run(runs_dir, tmp_path, lambda data: 40)  # nothing usable left
    out = tmp_path / "report"
    specs = [f"A={runs_dir / 'run_a.log'}", str(bad / "empty.jsonl"), str(bad / "empty.log"), str(bad / "empty.wandb"),
             str(bad / "types.jsonl"), str(cut)]  # fmt: skip
    assert report.main([*specs, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for path in (bad / "empty.jsonl", bad / "empty.log", bad / "empty.wandb", bad / "types.jsonl", cut_log):
        assert f"report: skipped {path}: " in err, (path, err)
    rows = list(csv.DictReader(open(out / "table.csv", encoding="utf-8")))
    assert {r["run"] for r in rows} == {"A"} and sorted(os.listdir(out)) == ["curves.png", "table.csv", "table.md"]


def test_no_usable_run_writes_nothing(report, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert report.main([str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'empty.jsonl'}: no metric records" in err and "no usable run" in err
    assert not (tmp_path / "o").exists()


def test_non_utf8_jsonl_is_a_message(report, tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"step": 1, "data": {"caf\xe9": 1}}\n')
    with pytest.raises(report.ReportError, match=r"latin1\.jsonl: line 1: not valid UTF-8"):
        report.load_runs([str(path)])
