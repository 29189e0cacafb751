"""The run-mode table (rpg/modes.py) is the one place that knows the reference and KL-control modes, the trainer
modes, the KL estimators and the top-k tails: no other module compares one of their names (as a string, as a named
constant holding one, or by a prefix/suffix test); the config's choices, docs/reference-modes.md's headings, the
worker's dispatch, what a run installs and what a smoke run forces are its rows; the EMA reference's SMOKE=1 check can
fail. < 2 s."""

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
#: every name a table of rpg/modes.py owns: reference and KL-control modes, trainer modes, estimators, tails
TABLE_NAMES = MODE_NAMES | {*modes.TRAINER_MODES, modes.LEGACY_TRAINER.name, *modes.ESTIMATORS, *modes.TOPK_TAILS}
SOURCES = {p: p.read_text() for p in sorted((REPO / "rpg").rglob("*.py"))}


def _strings(node: ast.AST) -> set[str]:
    """The string literals of `node`: alone, or inside a tuple/list/set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def named_constants(*sources: str) -> frozenset[str]:
    """The names that the assignments of `sources` bind to a table name (or a literal collection holding one):
    `TRAINER_MODE = "schedule_free_sync"`, `ASYNC = ("colocate_async", "separate_async")`, `A, B = "sync", "x"`,
    `TRAINER_MODE = modes.SCHEDULE_FREE_TRAINER.name`."""
    found = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                named = [(t, v) for t, v in pairs if isinstance(t, ast.Name) and v is not None]
                found |= {t.id for t, v in named if _strings(v) & TABLE_NAMES or _row_name(v)}
    return frozenset(found)


def _row_name(node: ast.AST) -> bool:
    """`modes.<ROW>.name`: a table name read from its row (`TRAINER_MODE = modes.SCHEDULE_FREE_TRAINER.name`)."""
    if not (isinstance(node, ast.Attribute) and node.attr == "name"):
        return False
    root = node.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id == "modes"


CONSTANTS = named_constants(*(s for p, s in SOURCES.items() if p != REPO / "rpg" / "modes.py"))


def mode_comparisons(source: str, constants: frozenset[str] = CONSTANTS) -> list[int]:
    """Line numbers of the tests of `source` on a table name: a comparison (==, !=, in, not in, is) with a name as a
    string literal on either side (alone, or inside a tuple/list/set literal) or with a named constant that holds one
    (`constants`, `named_constants`; `X` or `module.X`), and a `.startswith`/`.endswith` whose argument is a prefix or
    suffix of a name (or such a constant). Strings elsewhere (messages, docstrings, defaults, dict keys) are allowed."""
    constants = constants | named_constants(source)

    def table_valued(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        return bool(_strings(node) & TABLE_NAMES) or name in constants

    def affix_test(node: ast.Call) -> bool:
        kind = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if kind not in ("startswith", "endswith") or not node.args:
            return False
        affixes, arg = _strings(node.args[0]), node.args[0]
        return table_valued(arg) or any(getattr(n, kind)(a) for a in affixes if a for n in TABLE_NAMES)

    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(table_valued(x) for x in [node.left, *node.comparators]):
            lines.add(node.lineno)
        elif isinstance(node, ast.Call) and affix_test(node):
            lines.add(node.lineno)
    return sorted(lines)


def test_no_module_but_the_table_compares_a_mode_name():
    found = {str(p.relative_to(REPO)): lines for p, source in SOURCES.items()
             if p != REPO / "rpg" / "modes.py" and (lines := mode_comparisons(source))}
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


def test_the_checker_finds_the_former_trainer_estimator_and_tail_tests():
    """The trainer-mode, estimator and tail tests this table replaced, put back, fail the check: against a string, a
    named constant (here or imported), a collection constant, and by a prefix/suffix test."""
    smoke = (REPO / "rpg" / "smoke.py").read_text()
    assert mode_comparisons(smoke) == []
    former = ('def uses_schedule_free(config) -> bool:\n    from rpg.schedule_free import TRAINER_MODE\n\n'
              '    return config.trainer.v1.get("trainer_mode", "sync") == TRAINER_MODE\n')
    assert "TRAINER_MODE" in CONSTANTS  # rpg.schedule_free's, seen from smoke.py
    assert len(mode_comparisons(smoke + former)) == 1
    # the literal "sync" is only a default there: without the named constants of rpg/ the mutant would pass
    assert mode_comparisons(smoke + former, constants=frozenset()) == []
    assert len(mode_comparisons('ASYNC = ("colocate_async", "x")\nif mode not in ASYNC: pass')) == 1
    assert len(mode_comparisons('if settings.kl_estimator == "topk": pass')) == 1
    assert len(mode_comparisons('if tail != BUCKET: pass', constants=frozenset({"BUCKET"}))) == 1
    assert len(mode_comparisons('if mode.endswith("_async"): pass')) == 1
    assert len(mode_comparisons('if str(m).startswith("schedule_free"): pass')) == 1
    assert mode_comparisons('if loss_mode.startswith("rpg_kl_"): pass') == []
    assert mode_comparisons('if row.asynchronous and tail.in_logits: pass') == []


def test_the_trainer_rows():
    """One function derives the trainer of a config (use_v1, trainer.v1.trainer_mode, verl's default once); the
    schedule-free trainer is the one rpg registers, by the install name rpg.install knows; the recipe knob's
    values are the rows with `knob`."""
    from rpg import install
    from rpg.preflight.recipe_argv import CHOICES

    assert modes.trainer_mode({"trainer": {}}).name == "sync" == modes.trainer_mode_named(None).name
    assert modes.trainer_mode({"trainer": {"use_v1": False, "v1": {"trainer_mode": "separate_async"}}}).use_v1 is False
    row = modes.trainer_mode({"trainer": {"v1": {"trainer_mode": "separate_async"}}})
    assert row.asynchronous and row.saves_transfer_queue and row.detached_actor
    with pytest.raises(ValueError, match=r"trainer.v1.trainer_mode='nope' is not valid; choose one of \['sync'"):
        modes.trainer_mode({"trainer": {"v1": {"trainer_mode": "nope"}}})
    assert modes.SCHEDULE_FREE_TRAINER.installs == (install.SCHEDULE_FREE,)
    assert not modes.SCHEDULE_FREE_TRAINER.saves_transfer_queue  # it reports "sync" to verl's base class
    assert CHOICES["TRAINER_MODE"] == {t.name: list(t.overrides) for t in modes.TRAINER_MODES.values() if t.knob}
    assert CHOICES["TRAINER_MODE"]["sync"] == [] and modes.LEGACY_TRAINER.overrides == ("trainer.use_v1=False",)


def test_the_estimator_and_tail_rows():
    from rpg.loss_config import KL_ESTIMATORS, KL_TOPK_TAILS
    from rpg.loss_options import option_defaults
    from rpg.topk_kl import TAILS

    assert set(KL_ESTIMATORS) == set(modes.ESTIMATORS) and set(KL_TOPK_TAILS) == set(TAILS) == set(modes.TOPK_TAILS)
    assert [e.name for e in modes.ESTIMATORS.values() if e.support] == ["topk"]
    assert {t.name for t in modes.TOPK_TAILS.values() if t.in_logits} == {"bucket"}
    defaults = option_defaults()
    assert all(defaults[n] == v for n, v in modes.OPTION_DEFAULTS.items())
    assert defaults["kl_estimator"] == modes.DEFAULTS["kl_estimator"]
    with pytest.raises(ValueError, match=r"kl_topk_tail='nope' is not valid; choose one of \['sampled', 'bucket'\]"):
        modes.topk_tail("nope")


def test_every_options_range_is_stated_by_its_row():
    """`Option.valid` is what the check of each option says (the messages quote it)."""
    from rpg.loss_config import RPGPolicyLossConfig

    bad = {"ref_refresh_steps": -1, "ref_refresh_kl": -1.0, "ref_kl_ema": 1.0, "ref_ema_decay": 1.0,
           "ref_ema_period": 0, "kl_target": -1.0, "kl_horizon": 0.1, "kl_topk": 0, "kl_topk_tail": "nope"}
    assert set(bad) == set(modes.OPTIONS)
    for name, value in bad.items():
        option = modes.OPTIONS[name]
        with pytest.raises(ValueError) as e:
            RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", **{name: value})
        assert f"{name}" in str(e.value) and option.valid in str(e.value), (name, str(e.value))


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
