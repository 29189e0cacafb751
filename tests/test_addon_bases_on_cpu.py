"""The add-on bases' published clip and aggregation (rpg/addon_bases.py; docs/losses.md#addon-bases): one row per
base the add-on accepts, the doc's table generated from it, and the early warning for a clip of the other kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpg import addon_bases
from rpg.kl_aggregation import APPROXIMATE_MODES, EXACT_MODES, INEXACT_MODES
from rpg.loss_table import ADDON_BASES

DOC = Path(__file__).resolve().parents[1] / "docs" / "losses.md"


def test_one_table_of_bases():
    """The add-on's choices of base_loss_mode are the names of addon_bases.BASES, not a second list: no literal
    collection of base names in rpg/loss_table.py (the former ADDON_BASES tuple fails this)."""
    import ast

    from rpg import loss_table

    assert ADDON_BASES == tuple(addon_bases.BASES)
    source = (Path(loss_table.__file__)).read_text()
    literals = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Tuple, ast.List, ast.Set))
                and len({e.value for e in n.elts if isinstance(e, ast.Constant)} & set(addon_bases.BASES)) > 1]
    assert literals == [], [ast.unparse(n) for n in literals]
    assert loss_table.base_loss_error("vanilla") is None and "not a base" in loss_table.base_loss_error("nope")


def test_one_row_per_base_and_the_doc_is_the_table():
    for base in addon_bases.BASES.values():
        assert base.loss_agg_mode in (*APPROXIMATE_MODES, *EXACT_MODES, *INEXACT_MODES), base
        assert (base.clip is None) or base.clips in (addon_bases.TOKEN, addon_bases.SEQUENCE, addon_bases.LOG)
    text = DOC.read_text()
    table = text.split("<!-- addon-bases:start -->\n")[1].split("<!-- addon-bases:end -->")[0]
    assert table == addon_bases.markdown_table()


@pytest.mark.parametrize("base,clip,warned", [
    ("gspo", (0.2, 0.28), True), ("gspo", (3e-4, 4e-4), False), ("vanilla", (3e-4, 4e-4), True),
    ("vanilla", (0.2, 0.28), False), ("geo_mean", (3e-4, 4e-4), True), ("gpg", (3e-4, 4e-4), False),
    ("cispo", (3e-4, 4e-4), False),  # no published range: nothing to name
])  # fmt: skip
def test_a_clip_of_the_other_kind_is_warned_naming_the_bases_values(base, clip, warned):
    warning = addon_bases.clip_warning(base, *clip)
    assert (warning is not None) == warned, warning
    if warned:
        published = addon_bases.BASES[base]
        assert f"actor_rollout_ref.actor.clip_ratio_low={published.clip[0]:g}" in warning
        assert f"actor_rollout_ref.actor.loss_agg_mode={published.loss_agg_mode}" in warning
