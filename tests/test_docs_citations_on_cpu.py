"""Product text cites what users have: the paper and the repository's own docs.

* No file of the repository mentions the private working notes (the word written in `PRIVATE` below, the notes'
  file names): users do not have them.
* Every citation of a repository Markdown file resolves: the file exists and, with `#anchor`, the anchor does. This
  covers Markdown links (`[D1](docs/differences.md#d1)`, `(#d11)`, `(losses.md#grpo-kl)`), plain citations in code
  comments and docstrings (`docs/losses.md#additive`) and their shorthand continuations
  (`docs/differences.md#s7-2, #s7-5`, `docs/losses.md#additive / #inside-clip`). Pages under docs/ are cited by
  explicit `<a id="...">` anchors only, so a reworded heading cannot break a citation; elsewhere a GitHub heading
  slug also counts.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Everything that ships in the repository (tests too: they cite the docs like the code does).
SCANNED = ["rpg", "recipe", "scripts", "docs", "benchmarks", "tests", "README.md", "pyproject.toml"]
SKIP_DIRS = {"__pycache__", ".venv", ".pytest_cache"}
# Spelled in pieces (joined at run time, not folded into the bytecode) so that neither this file nor its .pyc matches.
PRIVATE = ["".join(pieces) for pieces in [
    ("SP", "EC"), ("DES", "IGN.md"), ("shared/", "notes"), ("shared/", "paper"), ("cpu-rl-", "demo.md"),
    ("cpu-", "rollout.md"), ("tiny-", "model.md"), ("verl-0.9.1 ", "notes"),
]]

MD_LINK = re.compile(r"\]\(([^)\s]*)\)")  # [text](target)
MD_PATH = r"[\w./-]*[\w-]\.md"
PLAIN = re.compile(rf"(?<![\w/.-])((?:\.\./)*{MD_PATH})(#[\w-]+)?((?:\s*[,/]\s*#[\w-]+)*)")
MORE = re.compile(r"#([\w-]+)")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
COMMENT = re.compile(r"<!--.*?-->", re.S)


def product_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in sorted(path.rglob("*")) if p.is_file() and not SKIP_DIRS & set(p.parts)]
    return files


@lru_cache(maxsize=None)
def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # binary files cite nothing
        return None


def citations(text: str) -> list[tuple[str, str | None, bool]]:
    """(target file as written, anchor or None, is a Markdown link) for every citation of a Markdown file in `text`.

    A Markdown link `[x](file.md#a)` / `[x](#a)` (target "" = this file), or plain text naming `docs/page.md` or any
    `file.md#a`, optionally followed by shorthand anchors of the same file (`, #b`, ` / #c`). URLs are not
    citations."""
    text = COMMENT.sub("", text)
    found = []
    for m in MD_LINK.finditer(text):
        target = m.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        if file.endswith(".md") or (not file and anchor):
            found.append((file, anchor or None, True))
    for m in PLAIN.finditer(MD_LINK.sub("", text)):
        file, first, rest = m.group(1), m.group(2), m.group(3)
        if not first and not file.removeprefix("../").startswith(("docs/", "../docs/")):
            continue  # a bare `name.md` is a file name (e.g. an output file), not a citation
        found.append((file, first[1:] if first else None, False))
        found += [(file, a, False) for a in MORE.findall(rest)]
    return found


def resolve(source: Path, target: str, link: bool) -> Path | None:
    """The file a citation in `source` means. A Markdown link is relative to the citing file (as it renders); plain
    text is relative to the repository root (code cites `docs/...` from anywhere) or, within docs/, to docs/."""
    if not target:
        return source
    bases = [source.parent] if link else [ROOT] + ([source.parent] if source.parent == ROOT / "docs" else [])
    for base in bases:
        path = (base / target).resolve()
        if path.is_file():
            return path
    return None


def github_slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors_of(path: Path) -> frozenset[str]:
    text = COMMENT.sub("", path.read_text(encoding="utf-8"))
    ids = set(EXPLICIT_ANCHOR.findall(text))
    if (ROOT / "docs") not in path.parents:  # docs/ pages are cited by explicit anchors only
        ids |= {github_slug(h) for h in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}
    return frozenset(ids)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("see [D1](docs/differences.md#d1).", [("docs/differences.md", "d1", True)]),
        ("[up](#d11) and [page](losses.md)", [("", "d11", True), ("losses.md", None, True)]),
        ("# data (docs/differences.md#s7-2, #s7-5): files", [("docs/differences.md", "s7-2", False), ("docs/differences.md", "s7-5", False)]),
        ("(Algorithm 1; docs/losses.md#additive / #inside-clip).", [("docs/losses.md", "additive", False), ("docs/losses.md", "inside-clip", False)]),
        ("`docs/differences.md#d4, (b)`", [("docs/differences.md", "d4", False)]),
        ("[x](https://example.org/a.md#b) <!-- [y](gone.md#z) -->", []),
        ("[rel](../../docs/differences.md#d21)", [("../../docs/differences.md", "d21", True)]),
        ("writes OUT/table.md and results.md; see docs/cpu.md", [("docs/cpu.md", None, False)]),
    ],
)  # fmt: skip
def test_citation_parser(text, expected):
    assert citations(text) == expected


def test_no_private_notes_are_cited():
    hits = []
    for path in product_files():
        text = text_of(path)
        for n, line in enumerate((text or "").splitlines(), 1):
            hits += [f"{path.relative_to(ROOT)}:{n}: {word!r}" for word in PRIVATE if word in line]
    assert not hits, (
        "product text cites private notes users do not have; cite the paper (equation/table/algorithm/section "
        "numbers) or docs/*.md#anchor instead:\n" + "\n".join(hits)
    )


def test_every_cited_doc_and_anchor_exists():
    broken, checked = [], 0
    for path in product_files():
        text = text_of(path)
        if text is None or path == Path(__file__).resolve():
            continue
        for target, anchor, link in citations(text):
            checked += 1
            where = f"{path.relative_to(ROOT)}: {target}{'#' + anchor if anchor else ''}"
            file = resolve(path, target, link)
            if file is None:
                broken.append(f"{where} (no such file)")
            elif anchor is not None and anchor not in anchors_of(file):
                hint = ' (docs/ pages need an explicit <a id="...">)' if (ROOT / "docs") in file.parents else ""
                broken.append(f"{where} (no such anchor in {file.relative_to(ROOT)}{hint})")
    assert checked > 100, f"only {checked} citations found: the scan is broken"
    assert not broken, "citations that do not resolve:\n" + "\n".join(broken)
