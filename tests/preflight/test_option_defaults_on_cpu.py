"""The RPG options' defaults are written once, in their declaration (`rpg.loss_options.RPGOptions`, whose mode options
take `rpg.modes.OPTION_DEFAULTS`): no module of the package reads an option with a literal fallback of its own
(`x.get("kl_topk", 64)`, `getattr(x, "kl_coef", 1e-4)`, `OmegaConf.select(cfg, "...kl_topk", default=64)`). Code after
`rpg.launch.validate` reads the typed `RPGPolicyLossConfig` instead (issue 39, the typed config to the end).

A `None` fallback is no default (it reads "absent"), so `x.get("reference", None) or modes.DEFAULTS["reference"]`
passes: its default is the declaration's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rpg import modes
from rpg.loss_options import option_names

PACKAGE = Path(__file__).resolve().parents[2] / "rpg"
DECLARATIONS = {"loss_options.py"}  # the one place the defaults are written (modes.OPTION_DEFAULTS is a table)
OPTIONS = frozenset(option_names()) | frozenset(modes.OPTION_DEFAULTS)
#: reads of a key that shares an option's name but is not the option, each with its reason
NOT_THE_OPTION = {
    # a saved reference state's mode (rpg/reference/written.py's file format): a file written before the EMA
    # reference holds none and was periodic
    ("rpg/reference/written.py", "reference"),
}


def _literal(node: ast.AST) -> bool:
    """A literal value other than None: a constant, a signed constant, or a list/tuple/set/dict of literals."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(e) or isinstance(e, ast.Constant) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(isinstance(v, ast.Constant) or _literal(v) for v in node.values)
    return False


def _option(node: ast.AST) -> str | None:
    """The RPG option a string constant names (`"kl_topk"`, or a dotted key ending in it), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        name = node.value.rsplit(".", 1)[-1]
        return name if name in OPTIONS else None
    return None


def literal_defaults(source: str) -> list[tuple[int, str]]:
    """(line, option) of every read of an RPG option with a literal fallback in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        args = node.args
        if name == "get" and len(args) >= 2 and (option := _option(args[0])) and _literal(args[1]):
            found.append((node.lineno, option))
        elif name == "getattr" and len(args) == 3 and (option := _option(args[1])) and _literal(args[2]):
            found.append((node.lineno, option))
        elif name == "select" and args:
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            option = next((o for a in args if (o := _option(a))), None)
            if option and default is not None and _literal(default):
                found.append((node.lineno, option))
    return found


def test_no_module_restates_an_rpg_options_default():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {option}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name not in DECLARATIONS
             for line, option in literal_defaults(path.read_text())
             if (str(path.relative_to(PACKAGE.parent)), option) not in NOT_THE_OPTION]
    assert found == [], "an RPG option read with a literal default (read the typed RPGPolicyLossConfig, whose " \
                        "fields hold the declared defaults):\n" + "\n".join(found)


@pytest.mark.parametrize("mutant", [
    'k = int(policy_loss.get("kl_topk", 64))',
    'tail = pl.get("kl_topk_tail", "sampled")',
    'beta = getattr(settings, "kl_coef", 1e-4)',
    'k = OmegaConf.select(cfg, "actor_rollout_ref.actor.policy_loss.kl_topk", default=64)',
    'steps = pl.get("ref_refresh_steps", -1)',
])
def test_the_check_catches_a_restated_default(mutant):
    """The mutants that restate a default (the reads issue 39 found: memory.py's top-k width, summary.py's tail and
    β) are caught; the same reads without a literal fallback are not."""
    assert len(literal_defaults(mutant)) == 1
    assert literal_defaults(mutant.replace("64", "None").replace('"sampled"', "None").replace("1e-4", "None")
                            .replace("-1", "None")) == []


def test_the_check_reads_the_code_as_it_was_before_issue_39():
    """The reads the issue names, as they were written (rpg/preflight/memory.py:564-566, summary.py:31-35), fail it."""
    before = '''
def topk_width(policy_loss):
    if str(policy_loss.get("kl_estimator", "sampled")) != "topk":
        return 0
    return int(policy_loss.get("kl_topk", 64))

def _loss(pl):
    if pl.get("kl_credit", "token") != "token":
        pass
    kl_coef = pl.get("kl_coef", 1e-4)
'''
    found = sorted(option for _, option in literal_defaults(before))
    assert found == ["kl_coef", "kl_credit", "kl_estimator", "kl_topk"]
