"""The README leads and the docs agree with each other and with the code.

* README.md: at most 200 lines; the GPU quick start (install, data, dry run, smoke run, run, report) within its first
  60 lines; the demo and test commands (`.ci/run` runs the latter); no difference id (`D26`) written as prose; every
  relative link (Markdown files, the figure) resolves; every script it names exists.
* One install line for the GPU stack: `-r requirements-gpu.txt`, never the `gpu` extra, and the README's install lines
  are the ones docs/gpu.md explains.
* The validation metric the docs name for the recipes, `val-core/<source>/acc/mean@N`, is the name verl 0.9.1 gives it
  under the recipes' validation settings (`val_kwargs.n` of rpg/config/rpg_trainer.yaml on 32×-repeated files).
* docs/README.md's range of difference ids reaches the last id of docs/differences.md.
(Anchors of Markdown citations are checked by tests/test_docs_citations_on_cpu.py; the loss table by
tests/test_loss_table_on_cpu.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = [ROOT / "README.md", ROOT / "recipe/rpg/README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code_and_text(text: str) -> str:
    """`text` without HTML comments and link targets (an id in `(docs/differences.md#d26)` is not prose)."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"\]\([^)]*\)", "]", text)


def test_readme_is_short_and_leads_with_the_gpu_quick_start():
    lines = README.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; at most 200 (move details to docs/)"
    first = "\n".join(lines[:60])
    for step in ("pip install -r requirements-gpu.txt", "rpg-prepare-data all", "RPG_DRY_RUN=1 bash recipe/rpg/",
                 "SMOKE=1 bash recipe/rpg/", "rpg-report "):
        assert step in first, f"the GPU quick start's {step!r} is not in README.md's first 60 lines"
    assert re.search(r"^bash recipe/rpg/\S+\.sh", first, re.M), "the run itself is not in the first 60 lines"


def test_readme_keeps_the_demo_and_test_commands():
    assert re.search(r"^bash scripts/demo_cpu\.sh\b", README, re.M)
    assert re.search(r"^bash scripts/test\.sh\b", README, re.M)
    assert "bash scripts/test.sh" in (ROOT / ".ci/run").read_text()


def test_readme_writes_no_difference_id_as_prose():
    prose = _code_and_text(README)
    ids = sorted(set(re.findall(r"\bD\d{1,2}\b", prose)))
    assert not ids, f"README.md names differences by id {ids}: say what differs and link its entry in the differences page"


def test_readme_links_resolve():
    targets = re.findall(r"\]\(([^)\s]+)\)", re.sub(r"<!--.*?-->", "", README, flags=re.S))
    missing = [t for t in targets if "://" not in t and not t.startswith("#")
               and not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert figures, "README.md shows no figure"
    for fig in figures:
        assert (ROOT / fig).stat().st_size < 300_000, f"{fig} is 300 KB or more"


def _scripts_named(text: str) -> set[str]:
    names = set()
    for name in re.findall(r"`((?:recipe/rpg/)?(?:[\w.-]+/)?run_[\w.{},-]+\.sh)`", text):
        parts = re.match(r"(.*?)\{([^}]*)\}(.*)", name)
        names |= {parts.group(1) + alt + parts.group(3) for alt in parts.group(2).split(",")} if parts else {name}
    return names


def test_every_script_the_readmes_name_exists():
    recipes = {p.name for p in (ROOT / "recipe/rpg").rglob("run_*.sh")}
    for doc in (ROOT / "README.md", ROOT / "recipe/rpg/README.md"):
        named = _scripts_named(doc.read_text(encoding="utf-8"))
        assert len(named) > 5, f"no script names found in {doc}: the pattern is broken"
        missing = sorted(n for n in named if Path(n).name not in recipes)
        assert not missing, f"{doc.relative_to(ROOT)} names scripts that do not exist: {missing}"


def test_one_gpu_install_line():
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert not re.search(r"pip install [^\n`]*\.\[gpu\]", text), (
            f"{doc.relative_to(ROOT)} installs the GPU stack with the `gpu` extra; the one form is "
            "`pip install -r requirements-gpu.txt` (docs/gpu.md#install)"
        )
    gpu_install = (ROOT / "docs/gpu.md").read_text(encoding="utf-8")
    for line in re.findall(r"^(pip install .*?)(?:\s+#.*)?$", README, re.M):
        for command in line.split(" && "):
            assert command.strip() in gpu_install, f"README.md's {command!r} is not how docs/gpu.md installs"


def test_documented_validation_metric_is_the_one_verl_logs():
    """verl 0.9.1 names `mean@<responses per row id>`; the recipes sample val_kwargs.n per row of 32×-repeated files."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    config = yaml.safe_load((ROOT / "rpg/config/rpg_trainer.yaml").read_text())
    n = config["actor_rollout_ref"]["rollout"]["val_kwargs"]["n"]
    rows = [f"row{i}" for i in range(3 * 32)]  # 3 problems × 32 copies, each row its own uid as verl gives it
    uids = [uid for uid in rows for _ in range(n)]
    acc = list(np.random.default_rng(0).integers(0, 2, len(uids)).astype(float))
    metrics = process_validation_metrics(["aime2025"] * len(uids), uids, {"acc": acc})
    logged = {name for name in metrics["aime2025"]["acc"] if name.startswith("mean@")}
    assert logged == {f"mean@{n}"}
    for doc in DOCS:
        for k in re.findall(r"val-core/<[\w-]+>/acc/mean@(\d+)", doc.read_text(encoding="utf-8")):
            assert f"mean@{k}" in logged, (
                f"{doc.relative_to(ROOT)} names the recipes' validation metric mean@{k}; verl logs it as "
                f"val-core/<source>/acc/mean@{n} (its value is the paper's mean@32)"
            )


def test_docs_index_names_every_difference_id():
    last = max(int(i) for i in re.findall(r'<a id="d(\d+)"></a>', (ROOT / "docs/differences.md").read_text()))
    index = (ROOT / "docs/README.md").read_text(encoding="utf-8")
    ranges = re.findall(r"D1–D(\d+)", index) + re.findall(r"`#d1` … `#d(\d+)`", index)
    assert ranges, "docs/README.md states no range of difference ids"
    assert all(int(r) == last for r in ranges), f"docs/README.md's ranges {ranges} do not reach D{last}"


def _score_rows(text: str) -> dict[str, list[str]]:
    """`script → ["Last / Best", ...]` of the Markdown table rows that pair a script with the paper's scores."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        scores = [c for c in cells if re.fullmatch(r"\d\.\d{4} / \d\.\d{4}( ¹)?", c)]
        scripts = [c.strip("`") for c in cells if re.fullmatch(r"`run_[\w.-]+\.sh`", c)]
        if scores and scripts:
            rows[scripts[0]] = [s.removesuffix(" ¹") for s in scores]
    return rows


def test_readme_paper_numbers_are_the_recipe_tables():
    """The README repeats Table 3 from recipe/rpg/README.md (where every paper row's numbers are): they must agree."""
    ours = _score_rows(README)
    recipes = _score_rows((ROOT / "recipe/rpg/README.md").read_text(encoding="utf-8"))
    assert len(ours) == 6 and len(recipes) == 6 + 8 + 6 + 12, (len(ours), len(recipes))
    assert {s: recipes[s] for s in ours} == ours


def test_model_downloads_are_written_hf_download():
    """`huggingface-cli download` no longer works under huggingface_hub 1.33 ("deprecated and no longer works"): the
    docs and the memory plan's message (rpg/preflight/memory.py) write the same `hf download <model>`."""
    from rpg.preflight.memory import load_model_shape

    with pytest.raises(ValueError, match=re.escape("(hf download nobody/no-such-model config.json)")):
        load_model_shape("nobody/no-such-model")
    assert "`hf download Qwen/Qwen2.5-Math-7B`" in (ROOT / "docs/gpu.md").read_text(encoding="utf-8")
    for path in [*DOCS, *sorted((ROOT / "rpg").rglob("*.py"))]:
        assert "huggingface-cli download" not in path.read_text(encoding="utf-8"), path
