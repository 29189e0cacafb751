"""Every command the documentation gives runs as typed, or says why it is not run here (docs/testing.md#doc-commands).

A command is a line of a ```bash block (continuation lines joined, a here-document with its body), or an inline code
span that starts with `bash `, `python -m`, `rpg-`, `RPG_DRY_RUN=` or `SMOKE=`, in README.md, docs/*.md and
recipe/rpg/README.md. Each carries a marker (an HTML comment, invisible on GitHub):

    <!-- runs: rc=0 "text" -->   this test runs it, in this process, and checks the exit status and that each quoted
                                 text is in its output (stdout + stderr)
    <!-- gpu -->                 needs the GPU environment or a GPU node
    <!-- network -->             downloads (the hub, pip)
    <!-- slow -->                minutes of CPU (a training run, the test suite): run by scripts/test.sh's own tests
    <!-- tested: tests/<file> -->  what it does is checked by that test file (which must exist)
    <!-- name -->                a tool named in prose, not a line to type
    <!-- example -->             a template (placeholders, `...`) or a fragment, not runnable as typed

Placement: after an inline span (on the same line) for that span; on its own line before a ```bash block for every
command of the block, `|`-separated exceptions by command number (`<!-- gpu | 5: runs rc=0 "summary" -->`); on its
own line before a paragraph or table for every inline command in it without a marker of its own. A command without a
marker fails the test. An inline override (`key.path=value`, `+key.path=value`) is checked against the composed
config's key index (rpg/preflight/keys.py) unless marked.

The `runs` commands go through the launcher's own functions (`rpg.preflight.recipe_argv.command`, `rpg.launch.main`,
the console scripts' `main`) in this process: one verl import, a few seconds each.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "recipe" / "rpg" / "README.md"]
PREFIXES = ("bash ", "python -m", "rpg-", "RPG_DRY_RUN=", "SMOKE=")
NOT_COMMANDS = ("rpg-verl",)  # the project's name (generated tables quote it), not a command
KINDS = ("runs", "gpu", "network", "slow", "tested", "name", "example")
MARKER = re.compile(r"<!--\s*(" + "|".join(KINDS) + r")\b:?\s*(.*?)\s*-->")
ALONE = re.compile(r"^\s*(<!--\s*(?:" + "|".join(KINDS) + r")\b.*?-->)\s*$")
SPAN = re.compile(r"`([^`\n]+)`(\s*<!--.*?-->)?")
OVERRIDE = re.compile(r"^\+{0,2}[a-z_][a-z0-9_]*(\.[A-Za-z0-9_]+)+=\S+$")


@dataclass
class Command:
    where: str
    text: str
    kind: Optional[str]
    arg: str = ""
    inline: bool = False

    def __str__(self):
        return f"{self.where}: {self.text[:100]}"


def _marker(comment: Optional[str]) -> tuple[Optional[str], str]:
    m = MARKER.search(comment or "")
    return (m.group(1), m.group(2).strip()) if m else (None, "")


def _block_markers(comment: Optional[str]) -> tuple[tuple[Optional[str], str], dict[int, tuple[str, str]]]:
    """(default, {command number: marker}) of a block's marker `<!-- kind | 3: kind args | ... -->`."""
    if not comment:
        return (None, ""), {}
    body = comment.strip()[4:-3]
    default, *rest = body.split(" | ")
    per = {}
    for part in rest:
        number, _, marker = part.partition(":")
        per[int(number)] = _marker(f"<!-- {marker.strip()} -->")
    return _marker(f"<!--{default}-->"), per


def _block_commands(lines: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if not line.strip() or line.strip().startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        if m := re.search(r"<<'?(\w+)'?", line):  # a here-document: its body is part of the command
            while i < len(lines) and lines[i].strip() != m.group(1):
                line += "\n" + lines[i]
                i += 1
            i += 1
        out.append(line.strip())
    return out


def doc_commands(path: Path) -> list[Command]:
    rel = path.relative_to(REPO)
    lines = path.read_text().splitlines()
    found, pending, paragraph = [], None, None
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := ALONE.match(line):
            pending = m.group(1)
            i += 1
            continue
        if line.strip().startswith("```"):
            lang, start = line.strip()[3:].strip(), i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip().startswith("```"))
            if lang == "bash":
                (kind, arg), per = _block_markers(pending)
                for n, text in enumerate(_block_commands(lines[start:end]), 1):
                    k, a = per.get(n, (kind, arg))
                    found.append(Command(f"{rel}:{start + 1} command {n}", text, k, a))
            pending = paragraph = None
            i = end + 1
            continue
        if not line.strip():
            paragraph = None
        elif pending is not None:
            paragraph, pending = pending, None
        for m in SPAN.finditer(line):
            text = m.group(1)
            if (text.startswith(PREFIXES) and text not in NOT_COMMANDS) or OVERRIDE.match(text):
                kind, arg = _marker(m.group(2) or paragraph)
                found.append(Command(f"{rel}:{i + 1}", text, kind, arg, inline=True))
        i += 1
    return found


ALL = [c for f in FILES for c in doc_commands(f)]


def test_every_command_has_a_marker():
    unmarked = [str(c) for c in ALL if c.kind is None and not OVERRIDE.match(c.text)]
    assert not unmarked, "commands without a marker (docs/testing.md#doc-commands):\n" + "\n".join(unmarked)
    tested = [c for c in ALL if c.kind == "tested"]
    missing = [str(c) for c in tested if not (REPO / c.arg.split("::")[0]).is_file()]
    assert not missing, missing
    assert len([c for c in ALL if c.kind == "runs"]) >= 8


def test_every_inline_override_is_a_key_of_the_config():
    from rpg.preflight import keys

    top = {k for k in keys.load_index()["keys"] if "." not in k}  # `actor.use_kl_loss=True` is prose shorthand
    overrides = [c for c in ALL if c.inline and OVERRIDE.match(c.text) and c.kind is None
                 and c.text.lstrip("+").split(".")[0] in top]  # fmt: skip
    assert len(overrides) > 20
    bad = [f"{c}: {p}" for c in overrides for p in keys.key_problems([c.text])]
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------------------------------------------
# running the `runs` commands in this process
# ---------------------------------------------------------------------------------------------------------------
RUNS = [c for c in ALL if c.kind == "runs"]
EXPECT = re.compile(r"rc=(\d+)")


def _console_scripts() -> dict[str, str]:
    text = (REPO / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    return dict(re.findall(r'^(\S+) = "(\S+)"', text, re.M))


def _invoke(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run one documented command line in this process; (exit status, stdout + stderr)."""
    from hydra.core.global_hydra import GlobalHydra

    from rpg import launch
    from rpg.preflight import recipe_argv

    words = list(argv)
    while words and re.match(r"^[A-Z_]+=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[:1] == ["bash"] and words[1].startswith("recipe/rpg/"):
        script = REPO / words[1]
        line = next(ln for ln in script.read_text().splitlines() if ln.startswith("source "))
        spec = recipe_argv.parse(["--repo", str(REPO), "--script", script.stem, "--",
                                  *[a for a in shlex.split(line)[2:] if a != "$@"], *words[2:]])  # fmt: skip
        command, new_env, _ = recipe_argv.command(spec, dict(os.environ, **env))
        env.update(new_env)
        entry, args = launch.main, command[3:]
    elif words[:3] == ["python", "-m", "rpg.launch"]:
        entry, args = launch.main, words[3:]
    elif words and words[0] in _console_scripts():
        module, _, function = _console_scripts()[words[0]].partition(":")
        entry, args = getattr(__import__(module, fromlist=[function]), function), words[1:]
    else:
        raise AssertionError(f"the test cannot run {argv!r} in-process: mark it or extend _invoke")
    out = io.StringIO()
    saved_env, saved_argv = dict(os.environ), list(sys.argv)
    os.environ.update(env)
    GlobalHydra.instance().clear()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = entry(args)
                rc = int(code or 0)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        GlobalHydra.instance().clear()
    return rc, out.getvalue()


@pytest.mark.parametrize("cmd", RUNS, ids=[c.where for c in RUNS])
def test_documented_command_runs_as_the_doc_says(cmd, monkeypatch):
    expect = EXPECT.search(cmd.arg)
    assert expect, f"{cmd}: a runs marker needs rc=N and optionally \"text\""
    monkeypatch.setenv("PYTHON", sys.executable)
    argv = shlex.split(cmd.text, comments=True)
    assert "|" not in argv and ">" not in argv, f"{cmd}: pipes and redirections are not run here"
    rc, output = _invoke(argv, {})
    assert rc == int(expect.group(1)), f"{cmd}: exit status {rc}\n{output[-3000:]}"
    for text in re.findall(r'"([^"]*)"', cmd.arg):
        assert text in output, f"{cmd}: {text!r} not in the output\n{output[-3000:]}"


# ---------------------------------------------------------------------------------------------------------------
# facts the docs quote from the code (the stale ones of issue 32)
# ---------------------------------------------------------------------------------------------------------------
def test_script_counts_the_docs_quote_are_the_files():
    scripts = {d: sorted((REPO / "recipe" / "rpg" / d).glob("run_*.sh")) for d in ("4b", "7b")}
    gpu = (REPO / "docs" / "gpu.md").read_text()
    for ctx, count in re.findall(r"\| 4b, (\dK) context \((\d+) scripts\)", gpu):
        setup = f"setup=qwen3_4b_{ctx.lower()}"
        assert int(count) == sum(setup in s.read_text() for s in scripts["4b"]), ctx
    factor4 = sum("recipe.token_len_factor=4" in s.read_text() for s in scripts["7b"])
    assert f"`recipe.token_len_factor=1` ({len(scripts['7b']) - factor4} scripts" in gpu
    assert f"`recipe.token_len_factor=4` ({factor4} `*_rf_clip_ppo*` scripts)" in gpu
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"{len(scripts['4b']) + len(scripts['7b'])} GPU scripts" in readme
    beyond = (REPO / "recipe" / "rpg" / "README.md").read_text().count("\n| not in the paper:")
    words = {4: "four", 5: "five", 6: "six", 7: "seven"}
    assert f"the authors' {len(scripts['7b'])} Qwen2.5-(Math-)7B scripts and {words[beyond]} beyond the paper" in readme


def test_the_layout_names_every_module_and_no_missing_folder():
    text = (REPO / "docs" / "README.md").read_text()
    layout = text.split("## Repository layout")[1].split("```")[1]
    modules = [*(REPO / "rpg").glob("*.py"), *(REPO / "rpg" / "reference").glob("*.py")]
    missing = [m.name for m in modules if m.name != "__init__.py" and m.name not in layout]
    assert not missing, missing
    recipe_line = layout[layout.index("recipe/rpg/") :].split("scripts/")[0]
    for folder in re.findall(r"\b(\w+)/ \(", recipe_line):
        assert (REPO / "recipe" / "rpg" / folder).is_dir(), folder


def test_no_doc_calls_the_addon_unfinished_or_cuts_the_summary():
    for path in FILES:
        text = path.read_text()
        assert "being built" not in text, path
        assert not re.search(r"\| tail -\d+", text), f"{path}: use RPG_DRY_RUN=summary, not tail"
