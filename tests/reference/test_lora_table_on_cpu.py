"""Every LoRA × reference × estimator × KL-control combination either validates or is refused with its reason: one
test per row of the table in docs/reference-modes.md#lora (read from the docs, so the two cannot drift), through the
launcher's whole validation (`rpg.launch.validate`: the LoRA rules, verl's own checks, the typed configs, the recipe
and RPG rules), on this machine without vLLM (the LoRA rank check is the launcher's, docs/gpu.md#lora). ~15 s.
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import pytest

from rpg import modes

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "recipes"))  # recipe_helpers, test_launch_on_cpu's MINIMAL config

from recipe_helpers import cfg_with  # noqa: E402
from test_launch_on_cpu import MINIMAL  # noqa: E402

DOCS = REPO / "docs" / "reference-modes.md"
PL = "actor_rollout_ref.actor.policy_loss."
LORA = {"actor_rollout_ref.model.lora_rank": 32, "actor_rollout_ref.model.lora_alpha": 64}


def docs_table() -> list[tuple[str, str, str, str]]:
    """(reference, kl_estimator, kl_control, result) of every row between the docs' lora-table markers."""
    text = DOCS.read_text()
    body = text[text.index("<!-- lora-table -->"):text.index("<!-- /lora-table -->")]
    lines = [line for line in body.splitlines() if line.startswith("|")]
    rows = [tuple(c.strip() for c in line.strip().strip("|").split("|")) for line in lines]
    return rows[2:]  # past the header and its rule


ROWS = docs_table()


def test_the_table_has_every_combination_once():
    combos = [r[:3] for r in ROWS]
    expected = list(itertools.product(modes.REFERENCES, modes.ESTIMATORS, modes.KL_CONTROLS))
    assert sorted(combos) == sorted(expected)
    assert all(r[3] == "runs" or r[3].startswith("refused: ") for r in ROWS), ROWS


@pytest.fixture(scope="module")
def base():
    from rpg.launch import compose_config

    return compose_config(MINIMAL)


def _settings(reference: str, estimator: str, control: str) -> dict:
    """The overrides of one row: the mode, what it requires (the reference model, K, the KL target), and
    branch_on=advantage with the top-k KL (the RPG-REINFORCE default's effective advantage has no top-k form)."""
    row = modes.REFERENCES[reference]
    out = {PL + "reference": reference, PL + "kl_estimator": estimator, PL + "kl_control": control}
    if row.reference_model:
        out |= {"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 0.0}
    if row.needs_a_trigger:
        out[PL + "ref_refresh_steps"] = 64
    if modes.KL_CONTROLS[control].moves_beta:
        out[PL + "kl_target"] = 1e-3
    if modes.ESTIMATORS[estimator].support:
        out[PL + "branch_on"] = "advantage"
    return out


@pytest.mark.parametrize("reference, estimator, control, result", ROWS, ids=["-".join(r[:3]) for r in ROWS])
def test_each_combination_runs_or_is_refused_with_its_reason(base, reference, estimator, control, result):
    from rpg.launch import RecipeConfigError, validate

    without_lora = cfg_with(base, _settings(reference, estimator, control))
    validate(without_lora)  # the combination itself is valid without LoRA
    with_lora = cfg_with(without_lora, LORA)
    if result == "runs":
        settings = validate(with_lora).rpg
        assert (settings.reference, settings.kl_estimator, settings.kl_control) == (reference, estimator, control)
        return
    with pytest.raises(RecipeConfigError) as refusal:
        validate(with_lora)
    message = str(refusal.value)
    assert result.removeprefix("refused: ") in message, message
    assert "actor_rollout_ref.model.lora_rank=32" in message  # the setting is named
    assert re.search(r"Use reference=ema without LoRA", message), message  # ... and the fix
