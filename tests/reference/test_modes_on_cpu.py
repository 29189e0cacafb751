"""The run-mode table (rpg/modes.py) is the one place that knows the reference and KL-control modes: no other module
compares a mode name; the config's choices, docs/reference-modes.md's headings, the worker's dispatch, what a run
installs and what a smoke run forces are its rows; the EMA reference's SMOKE=1 check can fail. < 2 s."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rpg import modes

REPO = Path(__file__).resolve().parents[2]
MODE_NAMES = frozenset(m.name for m in modes.ROWS)


def mode_comparisons(source: str) -> list[int]:
    """Line numbers of the comparisons (==, !=, in, not in, is) of `source` with a mode or control name as a string
    literal on either side (alone, or inside a tuple/list/set literal). Strings elsewhere (messages, docstrings,
    defaults, dict keys) are allowed."""

    def names(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
                  and any(names(x) & MODE_NAMES for x in [node.left, *node.comparators]))  # fmt: skip


def test_no_module_but_the_table_compares_a_mode_name():
    found = {str(p.relative_to(REPO)): lines for p in sorted((REPO / "rpg").rglob("*.py"))
             if p != REPO / "rpg" / "modes.py" and (lines := mode_comparisons(p.read_text()))}  # fmt: skip
    assert found == {}, f"compare a row's attribute (rpg/modes.py) instead of its name: {found}"


def test_the_checker_finds_the_mutant_of_the_disk_estimate():
    """The estimate's former `reference == 'ema'` put back into preflight/disk.py fails the check above."""
    source = (REPO / "rpg" / "preflight" / "disk.py").read_text()
    assert mode_comparisons(source) == []
    anchor = "    # rpg_reference/ next to the actor's checkpoint\n"
    assert anchor in source
    mutant = source.replace(anchor, anchor + '    if str(actor.policy_loss.reference) == "ema":\n        pass\n')
    assert len(mode_comparisons(mutant)) == 1
    assert len(mode_comparisons('if mode in ("periodic", "other"): pass')) == 1
    assert mode_comparisons('raise ValueError(f"reference=\'ema\' needs {x!r}")') == []


def test_the_configs_choices_are_the_rows():
    from rpg.loss_config import KL_CONTROLS, REFERENCE_MODES, RPGPolicyLossConfig

    assert set(REFERENCE_MODES) | set(KL_CONTROLS) == MODE_NAMES
    for row in modes.ROWS:  # every row builds, with its required options
        options = {"kl_target": 1e-3} if row.moves_beta else {"ref_refresh_steps": 4} if row.needs_a_trigger else {}
        RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", **{row.setting: row.name}, **options)
    for setting in ("reference", "kl_control"):
        with pytest.raises(ValueError, match=rf"{setting}='nope' is not valid; choose one of"):
            RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", **{setting: "nope"})


def test_the_docs_have_a_section_per_row():
    headings = [line for line in (REPO / "docs" / "reference-modes.md").read_text().splitlines()
                if line.startswith("#")]  # fmt: skip
    named = {n for h in headings for n in re.findall(r"`([a-z_]+)`", h)}
    assert MODE_NAMES <= named, f"rows without a heading in docs/reference-modes.md: {sorted(MODE_NAMES - named)}"


def test_the_workers_dispatch_is_the_rows_with_worker_state():
    from rpg.reference.hooks import STATES

    assert set(STATES) == {m.name for m in modes.ROWS if m.worker_state}
    assert all(cls.row is next(m for m in modes.ROWS if m.name == name) for name, cls in STATES.items())


def test_what_a_run_installs_is_its_rows():
    from rpg import install
    from rpg.loss_config import RPGPolicyLossConfig

    for ref in modes.REFERENCES.values():
        for ctl in modes.KL_CONTROLS.values():
            options = {"kl_target": 1e-3} if ctl.moves_beta else {}
            options |= {"ref_refresh_steps": 4} if ref.needs_a_trigger else {}
            s = RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", reference=ref.name, kl_control=ctl.name, **options)
            assert set(install.needed(s)) == set(ref.installs) | set(ctl.installs)


def test_checkpoint_bytes_and_smoke_forcing_come_from_the_rows():
    for row in modes.REFERENCES.values():
        parts = modes.checkpoint_bytes({"reference": row.name}, 10, 4)
        assert parts == ({row.checkpoint_label: 40.0} if row.writes_reference else {})
        forced, check = modes.smoke_overrides({"reference": row.name})
        assert check == row.writes_reference and forced == list(row.smoke)
    assert modes.smoke_overrides({"reference": "ema"})[0] == ["+actor_rollout_ref.actor.policy_loss.ref_ema_period=1"]


def test_one_override_names_the_whole_fix():
    """Selecting a mode that needs more than its name: the refusal names everything at once (issue 32 item 4)."""
    from rpg.loss_config import RPGPolicyLossConfig

    with pytest.raises(ValueError, match=r"kl_target .*It has no default: select the mode with .*kl_control=adaptive "
                                         r".*kl_target=<KL per token, e\.g\. 1e-3>"):  # fmt: skip
        RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", kl_control="adaptive")
    with pytest.raises(ValueError, match=r"needs ref_refresh_steps .*use_kl_loss=True .*kl_loss_coef=0 "
                                         r".*ref_refresh_steps=<K"):  # fmt: skip
        RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", reference="periodic")
    assert modes.REFERENCES["ema"].whole_fix() == ("actor_rollout_ref.actor.policy_loss.reference=ema "
                                                    "actor_rollout_ref.actor.use_kl_loss=True "
                                                    "actor_rollout_ref.actor.kl_loss_coef=0")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# The EMA reference's in-worker check (SMOKE=1): Σ new = τ·Σ old + (1 − τ)·Σ actor on each rank's shards
# ---------------------------------------------------------------------------------------------------------------------
def _ema(decay: float):
    from rpg.reference.ema import EmaReference
    from rpg.reference.schedule import RefreshSchedule

    def worker(seed: int):
        torch.manual_seed(seed)
        return SimpleNamespace(engine=SimpleNamespace(module=torch.nn.Linear(3, 2), optimizer_step=lambda: None))

    return EmaReference(RefreshSchedule(1), worker(0), worker(1), ema_decay=decay)


def test_the_ema_check_passes_on_the_blend_and_fails_on_a_wrong_one(monkeypatch):
    monkeypatch.setenv(modes.VERIFY_ENV, "1")
    state = _ema(0.9)
    state.optimizer_steps = 1
    metrics = state.end_step(0.01, None)
    assert metrics["ref_ema_updated"] == 1.0 and state.last_check is not None and state.last_check <= 1e-6
    assert set(metrics) <= set(state.row.metrics)
    wrong = _ema(0.9)
    monkeypatch.setattr(wrong, "write", lambda actor, ref: ref.weight.data.mul_(0.5))  # not the blend
    wrong.optimizer_steps = 1
    with pytest.raises(RuntimeError, match=r"EMA reference check: rank 0's shards after the blend sum to"):
        wrong.end_step(0.01, None)
