"""Last/Best table and training curves (paper Tables 3-8, Figs. 4-6) from verl run logs.

Usage::

    rpg-report RUN [RUN ...] --out DIR [--metric-prefix val-core] [--k auto|K]   # or python -m rpg.tools.report

Each RUN is ``PATH`` or ``NAME=PATH`` (the name labels the run; default: the wandb run name, else the
file stem). Supported inputs (verl 0.9.1, ``trainer.logger=[...]``):

* ``console`` logger output (a saved stdout/stderr, ``.log``/``.out``/``.txt`` or any other text file):
  lines ``step:N - key:value - ...`` written by ``verl.utils.logger.LocalLogger``; Ray's ``(pid=..)``
  prefixes and numpy reprs such as ``np.float64(0.5)`` are handled;
* ``file`` logger output (``.jsonl``): one ``{"step": N, "data": {...}}`` object per line, written by
  ``verl.utils.tracking.FileLogger`` to ``$VERL_FILE_LOGGER_PATH`` or
  ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`` (default root ``.``);
* ``wandb`` run directories, offline or synced (``wandb/offline-run-*/run-<id>.wandb``): the ``.wandb``
  transaction log is read directly (LevelDB-log framing + the wandb SDK's ``Record`` protobuf; no
  network, no ``wandb sync``). ``files/wandb-summary.json`` is not used (it holds only final values).

A directory RUN is searched recursively: every ``.wandb`` file in it is one run; if there is none,
every ``.jsonl`` file; if none, every ``.log``/``.out``/``.txt`` file.

Outputs in ``--out`` (written atomically):

* ``table.md`` / ``table.csv``: per run and data source, ``Last`` (value at the last evaluated step),
  ``Best`` (maximum over evaluations) and the step of the Best (earliest on ties) of
  ``<metric-prefix>/<source>/acc/mean@<k>``. ``--k auto`` takes the largest k present per source: with
  the k-times repeated eval files of ``rpg.tools.prepare_data`` verl 0.9.1 names the metric ``mean@1`` (its
  value is the mean@k of the paper, docs/differences.md#s7-6); with ``val_kwargs.n=k`` it is ``mean@k``.
* ``curves.png``: one panel per data source (accuracy), then reward (``critic/score/mean``, falling back
  to ``critic/rewards/mean``), entropy (``actor/entropy``) and response length
  (``response_length/mean``) against step, one line per run; 4 panels per row, 400x300 px each.
* ``diagnostics.png`` and ``diagnostics.md`` (runs that log RPG's metrics): the KL estimate ``actor/rpg/kl``, the
  KL's share of the effective advantage ``actor/rpg/kl_adv_rel``, beside it the KL's gradient share
  ``actor/rpg/kl_share`` (the KL's share of the logit-space gradient, in [0, 1]: the top-k KL and the KL add-on;
  empty for the RPG losses with the sampled estimator, which log kl_adv_rel) and the token fraction of
  each dual-clip branch ``actor/rpg/frac_<branch>`` against step (8 panels), and their last and mean values per run.

Bad inputs never cost the good runs: an unreadable file (empty, not UTF-8, records of the wrong type) is skipped
with a message naming it; a wandb file cut short (a killed run) keeps its complete records, with a message; metric
values that are not numbers are ignored. Exit status: 0 all inputs read; 1 results written, but some inputs were
skipped or incomplete (messages on stderr); 2 nothing usable or bad arguments (nothing written).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rpg.atomic import atomic_write_bytes, sigterm_exits

ACC_RE = re.compile(r"^(?P<prefix>.+)/(?P<source>[^/]+)/acc/mean@(?P<k>\d+)$")
REWARD_METRICS = ("critic/score/mean", "critic/rewards/mean")
TRAIN_PANELS = (
    ("reward", REWARD_METRICS),
    ("entropy", ("actor/entropy",)),
    ("response length", ("response_length/mean",)),
)
# RPG's own diagnostics (rpg/losses.py `_metrics`; docs/losses.md): the KL estimate, the KL's share of the effective
# advantage A' = A + C/w, and the fraction of tokens in each dual-clip branch.
RPG_KL, RPG_KL_ADV_REL = "actor/rpg/kl", "actor/rpg/kl_adv_rel"
RPG_KL_SHARE = "actor/rpg/kl_share"  # the KL's logit-space gradient share (rpg/topk_loss.py, rpg/kl_addon.py)
RPG_BRANCHES = ("pos_grad", "pos_flat_high", "neg_flat_low", "neg_grad", "neg_flat_c")  # rpg.losses.BRANCHES
RPG_PANELS = (
    ("KL estimate: rpg/kl", RPG_KL),
    ("KL share of A': rpg/kl_adv_rel", RPG_KL_ADV_REL),
    ("KL gradient share: rpg/kl_share", RPG_KL_SHARE),
    *((f"tokens in branch: rpg/frac_{b}", f"actor/rpg/frac_{b}") for b in RPG_BRANCHES),
)
PANEL_PX = (400, 300)
PANELS_PER_ROW = 4
DPI = 100


class ReportError(ValueError):
    """Bad input: names the path and what is wrong."""


@dataclass
class Run:
    """One run: ``history[step][metric] = value`` (later records for the same step/metric win)."""

    name: str
    source: str
    history: dict[int, dict[str, float]] = field(default_factory=dict)

    def add(self, step: int, metrics: dict[str, object]) -> None:
        row = self.history.setdefault(int(step), {})
        for key, value in metrics.items():
            number = _number(value)
            if number is not None:
                row[key] = number

    def series(self, metric: str) -> list[tuple[int, float]]:
        """``[(step, value)]`` sorted by step, NaNs dropped."""
        return [(s, m[metric]) for s, m in sorted(self.history.items()) if metric in m and not math.isnan(m[metric])]

    def metrics(self) -> set[str]:
        return {k for m in self.history.values() for k in m}


def _number(value: object) -> float | None:
    """A metric value as a float; None for anything else (text, lists, dicts, integers beyond float range)."""
    if isinstance(value, (bool, int, float)):
        try:
            return float(value)
        except OverflowError:
            return None
    return None


def _step(value: object, where: str) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise ReportError(f"{where}: step {value!r} is not an integer")
    return int(value)


# ----------------------------------------------------------------------------------------- readers

_STEP_RE = re.compile(r"(?:^|[\s)])step:(\d+)((?: - [^\s:][^:]*:[^ ]+)*)")
_NP_RE = re.compile(r"^np\.\w+\((.*)\)$")


def _console_value(text: str) -> float | None:
    text = text.strip()
    match = _NP_RE.match(text)
    if match:
        text = match.group(1)
    text = {"np.True_": "1", "np.False_": "0", "True": "1", "False": "0"}.get(text, text)
    try:
        return float(text)
    except ValueError:
        return None


def read_console(path: Path) -> Iterator[tuple[int, dict[str, float]]]:
    """``(step, metrics)`` from ``LocalLogger`` lines ``step:N - key:value - key:value``."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            for line in raw.split("\r"):  # progress bars share lines with \r
                match = _STEP_RE.search(line)
                if not match:
                    continue
                metrics = {}
                for item in match.group(2).split(" - ")[1:]:
                    key, _, value = item.rpartition(":")
                    number = _console_value(value)
                    if key and number is not None:
                        metrics[key] = number
                if metrics:
                    yield int(match.group(1)), metrics


def read_file_logger(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """``(step, metrics)`` from verl's ``FileLogger`` JSONL (``{"step": N, "data": {...}}`` per line)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}: line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ReportError(f"{where}: not valid UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step, data = record["step"], record["data"]
            except json.JSONDecodeError:
                if not line.endswith("\n"):  # last line of a run still being written
                    return
                raise ReportError(f"{where}: not valid JSON") from None
            except (KeyError, TypeError):
                raise ReportError(f"{where}: not a verl file-logger record {{'step', 'data'}}") from None
            if not isinstance(data, dict):
                raise ReportError(f"{where}: 'data' is a {type(data).__name__}; expected an object of metrics")
            yield _step(step, where), data


_WANDB_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(path: Path) -> tuple[list[bytes], str | None]:
    """Payloads of a ``.wandb`` transaction log: a 7-byte header, then LevelDB-log records
    (``crc32c:u32 length:u16 type:u8 data``) in 32 KiB blocks, large records split FIRST/MIDDLE/LAST.

    Returns the complete records and, if the file ends inside a record (a run killed while writing), a message
    saying where it was cut.
    """
    data = path.read_bytes()
    if not data:
        raise ReportError(f"{path}: empty file")
    if not data.startswith(_WANDB_HEADER):
        raise ReportError(f"{path}: not a wandb transaction log (bad header {data[:7]!r})")
    records, pos, pending = [], len(_WANDB_HEADER), None
    while pos < len(data):
        room = _BLOCK - pos % _BLOCK
        if room < 7 or not any(data[pos : pos + min(room, 7)]):  # block trailer or zero padding (preallocated)
            pos += room
            continue
        if pos + 7 > len(data):
            return records, f"truncated at byte {len(data)}, inside the header of the record at byte {pos}"
        _crc, length, kind = struct.unpack_from("<IHB", data, pos)
        end = pos + 7 + length
        if end > len(data):
            return records, f"truncated at byte {len(data)}, inside the record at byte {pos} ({7 + length} bytes)"
        chunk, pos = data[pos + 7 : end], end
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind in (_MIDDLE, _LAST) and pending is not None:
            pending += chunk
            if kind == _LAST:
                records.append(pending)
                pending = None
    if pending is not None:
        return records, f"truncated at byte {len(data)}, inside a record split over blocks"
    return records, None


def read_wandb(path: Path) -> tuple[str | None, list[tuple[int, dict[str, object]]], str | None]:
    """``(run name, [(step, metrics)], problem)`` from a wandb ``run-<id>.wandb`` file (history records); ``problem``
    says where a truncated or corrupt file stops being readable (the records before it are returned)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    payloads, problem = _wandb_records(path)
    name, rows = None, []
    for index, payload in enumerate(payloads):
        record = pb.Record()
        try:
            record.ParseFromString(payload)
        except DecodeError:
            problem = f"record {index + 1} cannot be decoded (corrupt file)"
            break
        kind = record.WhichOneof("record_type")
        if kind == "run":
            name = record.run.display_name or record.run.run_id or name
        elif kind == "history":
            metrics = {}
            for item in record.history.item:
                key = item.key or ".".join(item.nested_key)
                try:
                    metrics[key] = json.loads(item.value_json)
                except json.JSONDecodeError:
                    continue
            step = _step(metrics.pop("_step", record.history.step.num), f"{path}: record {index + 1}")
            rows.append((step, {k: v for k, v in metrics.items() if not k.startswith("_")}))
    return name, rows, problem


def _run_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ReportError(f"{path}: no such file or directory")
    for patterns in (("*.wandb",), ("*.jsonl",), ("*.log", "*.out", "*.txt")):
        files = sorted({p.resolve() for pattern in patterns for p in path.rglob(pattern) if p.is_file()})
        if files:
            return files
    raise ReportError(f"{path}: no .wandb, .jsonl, .log, .out or .txt file inside")


def _load_file(file: Path, name: str | None, n_files: int) -> tuple[Run, str | None]:
    """One run file as a ``Run`` plus a message if only part of it could be read; ``ReportError`` if none."""
    problem = None
    if file.suffix == ".wandb":
        wandb_name, records, problem = read_wandb(file)
        default_name = wandb_name or file.parent.name
    elif file.suffix == ".jsonl":
        records, default_name = read_file_logger(file), file.stem
    else:
        records, default_name = read_console(file), file.stem
    run_name = name if name and n_files == 1 else (f"{name}/{default_name}" if name else default_name)
    run = Run(run_name, str(file))
    for step, metrics in records:
        run.add(step, metrics)
    if not run.history:
        raise ReportError(f"{file}: no metric records found" + (f" ({problem})" if problem else ""))
    if problem:
        problem = f"{file}: {problem}; using the {len(run.history)} steps before it"
    return run, problem


def load_runs(specs: Iterable[str], problems: list[str] | None = None) -> list[Run]:
    """Runs from ``PATH`` / ``NAME=PATH`` arguments (see module docstring).

    Without ``problems`` the first unreadable or truncated file raises ``ReportError``. With a list, an unreadable
    file is left out and a truncated one keeps its complete records; each gets one message naming the file there.
    """
    runs = []
    for spec in specs:
        name, sep, path_text = spec.partition("=")
        if not sep or not name or os.path.exists(spec):
            name, path_text = None, spec
        try:
            files = _run_files(Path(path_text))
        except ReportError as e:
            if problems is None:
                raise
            problems.append(f"skipped {e}")
            continue
        for file in files:
            try:
                run, problem = _load_file(file, name, len(files))
            except ReportError as e:
                if problems is None:
                    raise
                problems.append(f"skipped {e}")
                continue
            if problem:
                if problems is None:
                    raise ReportError(problem)
                problems.append(problem)
            runs.append(run)
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ReportError(f"duplicate run names {sorted({n for n in names if names.count(n) > 1})}; use NAME=PATH")
    return runs


# ----------------------------------------------------------------------------------------- table


@dataclass(frozen=True)
class Cell:
    metric: str
    last: float
    last_step: int
    best: float
    best_step: int


def accuracy_metrics(run: Run, prefix: str, k: int | None) -> dict[str, str]:
    """``{source: metric name}`` of the run's ``<prefix>/<source>/acc/mean@<k>`` (largest k if ``k`` is None)."""
    chosen: dict[str, tuple[int, str]] = {}
    for metric in run.metrics():
        match = ACC_RE.match(metric)
        if not match or match["prefix"] != prefix:
            continue
        mk = int(match["k"])
        if (k is None and mk > chosen.get(match["source"], (-1, ""))[0]) or mk == k:
            chosen[match["source"]] = (mk, metric)
    return {source: metric for source, (_, metric) in chosen.items()}


def last_best(series: Sequence[tuple[int, float]], metric: str) -> Cell:
    """Last = value at the last step; Best = maximum, at its earliest step (docs/differences.md#s7-6)."""
    last_step, last = series[-1]
    best_step, best = max(series, key=lambda sv: (sv[1], -sv[0]))
    return Cell(metric, last, last_step, best, best_step)


def build_table(
    runs: Sequence[Run], prefix: str = "val-core", k: int | None = None
) -> tuple[list[str], dict[str, dict[str, Cell]]]:
    """``(sources, {run name: {source: Cell}})``; sources sorted by name."""
    table, sources = {}, set()
    for run in runs:
        cells = {}
        for source, metric in accuracy_metrics(run, prefix, k).items():
            series = run.series(metric)
            if series:
                cells[source] = last_best(series, metric)
        table[run.name] = cells
        sources |= set(cells)
    return sorted(sources), table


def _fmt(value: float) -> str:
    return f"{value:.4f}"


def table_markdown(sources: Sequence[str], table: dict[str, dict[str, Cell]]) -> str:
    header = ["Run"] + [f"{s} {col}" for s in sources for col in ("Last", "Best")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run, cells in table.items():
        row = [run]
        for source in sources:
            cell = cells.get(source)
            if cell is None:
                row += ["–", "–"]
            else:
                row += [f"{_fmt(cell.last)} (step {cell.last_step})", f"{_fmt(cell.best)} (step {cell.best_step})"]
        lines.append("| " + " | ".join(row) + " |")
    metrics = sorted({c.metric for cells in table.values() for c in cells.values()})
    lines += ["", "Metrics: " + (", ".join(f"`{m}`" for m in metrics) if metrics else "none found") + "."]
    return "\n".join(lines) + "\n"


def table_csv(sources: Sequence[str], table: dict[str, dict[str, Cell]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["run", "source", "metric", "last", "last_step", "best", "best_step"])
    for run, cells in table.items():
        for source in sources:
            if source in cells:
                c = cells[source]
                writer.writerow([run, source, c.metric, repr(c.last), c.last_step, repr(c.best), c.best_step])
    return buffer.getvalue()


# ----------------------------------------------------------------------------------------- figure


def figure_png(runs: Sequence[Run], sources: Sequence[str], prefix: str = "val-core", k: int | None = None) -> bytes:
    """PNG bytes: accuracy per source, then reward, entropy, response length vs step; one line per run."""
    panels: list[tuple[str, list[tuple[str, list[tuple[int, float]]]]]] = []
    for source in sources:
        lines, used = [], set()
        for run in runs:
            metric = accuracy_metrics(run, prefix, k).get(source)
            lines.append((run.name, run.series(metric) if metric else []))
            used |= {metric.rsplit("/", 1)[1]} if metric else set()
        panels.append((f"{source} acc/{', '.join(sorted(used))}", lines))
    for title, candidates in TRAIN_PANELS:
        lines = []
        for run in runs:
            present = run.metrics()
            metric = next((m for m in candidates if m in present), None)
            lines.append((run.name, run.series(metric) if metric else []))
        panels.append((title, lines))

    return _draw(panels)


def _draw(panels: Sequence[tuple[str, list[tuple[str, list[tuple[int, float]]]]]]) -> bytes:
    """PNG bytes of `panels` (title, [(run name, series)]): 4 panels per row, 400x300 px each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(PANELS_PER_ROW, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    figsize = (PANEL_PX[0] * ncols / DPI, PANEL_PX[1] * nrows / DPI)
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, dpi=DPI, squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, lines) in zip(axes.flat, panels):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        drawn = False
        for name, series in lines:
            if series:
                steps, values = zip(*series)
                ax.plot(steps, values, marker="." if len(series) < 30 else None, label=name, linewidth=1.2)
                drawn = True
        if drawn:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    return buffer.getvalue()


def has_rpg_metrics(runs: Sequence[Run]) -> bool:
    return any(metric for _, metric in RPG_PANELS for run in runs if run.series(metric))


def diagnostics_png(runs: Sequence[Run]) -> bytes:
    """PNG bytes: RPG's diagnostics against step (the KL, its share of A', each branch's token fraction); one line
    per run."""
    return _draw([(title, [(run.name, run.series(metric)) for run in runs]) for title, metric in RPG_PANELS])


def diagnostics_markdown(runs: Sequence[Run]) -> str:
    """Per run: the last and mean value of each diagnostic over the logged training steps (the CPU demo's, at
    β = 1e-4: docs/launcher.md#diagnostics)."""
    header = ["run", "steps"] + [metric.removeprefix("actor/rpg/") + " last / mean" for _, metric in RPG_PANELS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        cells, steps = [], set()
        for _, metric in RPG_PANELS:
            series = run.series(metric)
            steps |= {step for step, _ in series}
            values = [v for _, v in series]
            cells.append(f"{values[-1]:.3g} / {sum(values) / len(values):.3g}" if values else "—")
        lines.append("| " + " | ".join([run.name, str(len(steps)), *cells]) + " |")
    return "\n".join(lines) + "\n\nMetrics: " + ", ".join(f"`{m}`" for _, m in RPG_PANELS) + " (rpg/losses.py, rpg/topk_loss.py).\n"


# ----------------------------------------------------------------------------------------- output


def report(
    run_specs: Sequence[str],
    out: str | os.PathLike,
    prefix: str = "val-core",
    k: int | None = None,
    problems: list[str] | None = None,
) -> dict[str, Path]:
    """Read runs, write ``table.md``, ``table.csv``, ``curves.png`` (and for RPG runs ``diagnostics.md``,
    ``diagnostics.png``) into ``out``; returns the paths.

    ``problems``: as in ``load_runs`` (unreadable inputs are reported there and the others still written).
    """
    runs = load_runs(run_specs, problems)
    if not runs:
        raise ReportError("no usable run in the inputs; nothing written")
    sources, table = build_table(runs, prefix, k)
    outputs = {
        "table.md": table_markdown(sources, table).encode("utf-8"),
        "table.csv": table_csv(sources, table).encode("utf-8"),
        "curves.png": figure_png(runs, sources, prefix, k),
    }
    if has_rpg_metrics(runs):  # RPG runs: their own diagnostics too (runs of verl's losses log none)
        outputs["diagnostics.md"] = diagnostics_markdown(runs).encode("utf-8")
        outputs["diagnostics.png"] = diagnostics_png(runs)
    paths = {name: Path(out) / name for name in outputs}
    for name, data in outputs.items():
        atomic_write_bytes(paths[name], data)
    return paths


def _k(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--k must be 'auto' or a positive integer, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rpg-report",
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "runs", nargs="+", metavar="RUN", help="[NAME=]PATH of a console log, file-logger .jsonl or wandb run dir"
    )
    parser.add_argument(
        "--out", required=True, help="output directory for table.md, table.csv, curves.png (RPG runs: diagnostics.*)"
    )
    parser.add_argument("--metric-prefix", default="val-core", help="validation metric section (default val-core)")
    parser.add_argument(
        "--k", type=_k, default=None, metavar="auto|K", help="mean@K to report (default auto: largest present)"
    )
    args = parser.parse_args(argv)
    problems: list[str] = []
    try:
        with sigterm_exits():  # SIGTERM, like Ctrl-C, leaves no temporary file behind
            paths = report(args.runs, args.out, args.metric_prefix, args.k, problems)
    except ReportError as e:
        print("".join(f"report: {p}\n" for p in problems) + f"report: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("report: interrupted; nothing partial was written", file=sys.stderr)
        return 130
    sys.stdout.write(paths["table.md"].read_text(encoding="utf-8"))
    print("report: wrote " + ", ".join(str(p) for p in paths.values()))
    if problems:
        print("".join(f"report: {p}\n" for p in problems), end="", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
