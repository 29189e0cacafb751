""""Did you mean" for every key of a launch, before verl is imported (docs/launcher.md#did-you-mean).

Hydra refuses an override whose key is not in the composed config ("Key 'lrr' is not in struct", after verl's import)
and advises a `+`; with the `+`, verl's dataclass then refuses the key inside a worker or the config build
("unexpected keyword argument 'lrr'"). Here every override is checked against a key index of the composed config
(`key_index.json`, written by `python -m rpg.preflight.keys --write`; tests/preflight/test_keys_on_cpu.py keeps it
equal to what Hydra composes): the union of the keys of `rpg_trainer` over every choice of each config group, the
fields of every node verl builds into a dataclass (its `_target_`), and the valid values of the choice fields. So

* `key=value` whose key is in no composition: refused with the closest existing keys, and the note that a `+`
  adds it only for verl to reject it (a key under a dataclass node) or adds a key nothing reads;
* `+key=value` under a dataclass node whose class has no such field: refused with the class's closest fields;
* `group=choice` (setup, method, optim, profile) that is not a file of `rpg/config/<group>/`: the valid choices;
* a choice field (`loss_agg_mode`, the RPG options with fixed values) given a value outside its choices.

Standard library only (json, difflib): the checks cost milliseconds. `policy_loss.*` keys and the loss names are
`rpg.preflight.early`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Iterable, Optional, Sequence

from rpg import modes
from rpg.atomic import atomic_write_text

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
INDEX_PATH = Path(__file__).resolve().with_name("key_index.json")
POLICY_LOSS_PREFIX = "actor_rollout_ref.actor.policy_loss."
#: Keys the check leaves to Hydra: its own settings and the recipe's free-form variables.
SKIPPED_PREFIXES = ("hydra.", "hydra/")
PLUS_NOTE = (
    "a `+` in front adds a key only where the config takes free keys; under a verl config class "
    "verl refuses it when it builds the class"
)

__all__ = ["INDEX_PATH", "build_index", "config_groups", "key_problems", "load_index", "write_index"]


def config_groups(config_dir: Path = CONFIG_DIR) -> dict[str, list[str]]:
    """The recipes' config groups and their choices: the folders of rpg/config and their yaml files."""
    return {d.name: sorted(f.stem for f in d.glob("*.yaml")) for d in sorted(config_dir.iterdir()) if d.is_dir()}


_INDEX: Optional[dict] = None


def load_index() -> dict:
    global _INDEX
    if _INDEX is None:
        _INDEX = json.loads(INDEX_PATH.read_text())
    return _INDEX


def _closest(value: str, names: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    return difflib.get_close_matches(value, sorted(set(names)), n=n, cutoff=cutoff)


def _parse(override: str) -> Optional[tuple[bool, str, str]]:
    """(added with `+`, key, value) of an override; None for a deletion, a Hydra setting or a list index."""
    if override.startswith("~") or "=" not in override:
        return None
    plus = override.startswith("+")
    key, _, value = override.lstrip("+").partition("=")
    key = key.strip()
    if not key or key.startswith(SKIPPED_PREFIXES) or "[" in key or "@" in key or "/" in key:
        return None
    return plus, key, value.strip().strip("'\"")


def _suggest(key: str, keys: Sequence[str]) -> list[str]:
    """The closest existing keys to `key`: siblings under its deepest existing parent first, then anywhere."""
    parent = key
    while parent and parent not in keys:
        parent = parent.rpartition(".")[0]
    depth = key.count(".")
    siblings = [k for k in keys if k.startswith(parent + ".") and k.count(".") == depth] if parent else []
    found = _closest(key, siblings, cutoff=0.5)
    if len(found) < 3:  # the same leaf name elsewhere (a key given under the wrong parent)
        leaf = key.rpartition(".")[2]
        by_leaf = {k: k.rpartition(".")[2] for k in keys}
        near = set(_closest(leaf, set(by_leaf.values()), n=2, cutoff=0.75))
        found += [k for k in keys if by_leaf[k] in near][:3]
    return list(dict.fromkeys(found or _closest(key, keys)))[:4]


def _dataclass_parent(key: str, index: dict) -> Optional[tuple[str, str, list[str]]]:
    """(node, class, fields) of the deepest existing ancestor of `key` that verl builds into a dataclass, when the
    component of `key` below it is not one of its fields; None otherwise."""
    keys, fields = index["keys"], index["fields"]
    node = key.rpartition(".")[0]
    while node and node not in keys:
        node = node.rpartition(".")[0]
    if node not in fields:
        return None
    child = key[len(node) + 1 :].split(".")[0]
    cls, names = fields[node]
    return None if child in names else (node, cls, names)


def key_problems(overrides: Sequence[str], index: Optional[dict] = None) -> list[str]:
    """The problems of the overrides' keys, group choices and choice values (empty: none), each one paragraph."""
    index = index or load_index()
    keys, choices = index["keys"], index["choices"]
    key_set = set(keys)  # grows with the keys earlier `+key` overrides add (a later plain override may set them)
    groups = config_groups()
    problems = []
    for override in overrides:
        parsed = _parse(override)
        if parsed is None:
            continue
        plus, key, value = parsed
        if "${" in value:  # resolved later: the full checks see it
            choices_here = False
        else:
            choices_here = key in choices
        if key in groups:
            if value not in groups[key] and value != "null":
                near = _closest(value, groups[key], cutoff=0.4)
                hint = f"did you mean {' or '.join(near)}? " if near else ""
                problems.append(
                    f"{key}={value}: no such choice of the config group {key!r} (rpg/config/{key}/); "
                    f"{hint}valid: {', '.join(groups[key])}"
                )
            continue
        if key.startswith(POLICY_LOSS_PREFIX) and key[len(POLICY_LOSS_PREFIX) :] not in ("loss_mode",):
            if choices_here and value not in choices[key]:  # unknown option names are rpg.preflight.early's
                problems.append(_bad_choice(key, value, choices[key]))
            continue
        if choices_here and value not in choices[key]:
            problems.append(_bad_choice(key, value, choices[key]))
        elif key in key_set:
            continue
        elif plus and _dataclass_parent(key, index) is None:
            key_set.add(key)
            continue
        elif (bad := _dataclass_parent(key, index)) is not None:
            node, cls, names = bad
            child = key[len(node) + 1 :].split(".")[0]
            near = _closest(child, names, cutoff=0.5) or _closest(child, names, cutoff=0.0)
            note = "verl would refuse the added key when it builds the class" if plus else PLUS_NOTE
            problems.append(
                f"{'+' if plus else ''}{key}={value}: {cls} (the config class of {node}) has no field "
                f"{child!r}; did you mean {' or '.join(f'{node}.{n}' for n in near)}? ({note})"
            )
        elif not plus:
            near = _suggest(key, keys)
            hint = f"did you mean {' or '.join(near)}?" if near else "no key is close."
            problems.append(
                f"{key}={value}: no such key in the composed config; {hint} ({PLUS_NOTE}; every key: "
                f"python -m rpg.launch --help-config)"
            )
    return problems


def _bad_choice(key: str, value: str, valid: Sequence[str]) -> str:
    near = _closest(value, valid, n=2, cutoff=0.4)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    return f"{key}={value}: not a valid value; {hint}valid: {', '.join(valid)}"


# ------------------------------------------------------------------------------------------------------------------
# The index (needs verl and Hydra): written by `python -m rpg.preflight.keys --write`, checked by a test
# ------------------------------------------------------------------------------------------------------------------
def _choice_fields() -> dict[str, list[str]]:
    # deferred: the loss config imports verl's config classes, the loss table torch (the index section needs both)
    from rpg import loss_config as lc
    from rpg.kl_aggregation import APPROXIMATE_MODES, EXACT_MODES, INEXACT_MODES
    from rpg.loss_table import ADDON_BASES

    policy_loss = {
        "reference": lc.REFERENCE_MODES,
        "kl_ratio": lc.KL_RATIO,
        "branch_on": lc.BRANCH_ON,
        "kl_placement": lc.KL_PLACEMENT,
        "kl_control": lc.KL_CONTROLS,
        "kl_credit": lc.KL_CREDIT,
        "base_loss_mode": ADDON_BASES,
        "kl_estimator": lc.KL_ESTIMATORS,
        "kl_topk_tail": lc.KL_TOPK_TAILS,
    }
    fields = {POLICY_LOSS_PREFIX + name: list(values) for name, values in policy_loss.items()}
    aggregations = [*APPROXIMATE_MODES, *EXACT_MODES, *INEXACT_MODES]
    trainer_modes = list(modes.TRAINER_MODES)  # the trainer-mode table's rows (verl's and rpg's schedule_free_sync)
    return {"actor_rollout_ref.actor.loss_agg_mode": aggregations, **fields, "trainer.v1.trainer_mode": trainer_modes}


def _walk(node, prefix: str, keys: set, targets: dict) -> None:
    from omegaconf import DictConfig

    for k in node.keys():
        path = f"{prefix}{k}"
        keys.add(path)
        child = node._get_node(k)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            if "_target_" in child and isinstance(child._get_node("_target_")._value(), str):
                targets.setdefault(path, child._get_node("_target_")._value())
            _walk(child, path + ".", keys, targets)


def build_index() -> dict:
    """Compose rpg_trainer so that every choice of each group is in one composition (the i-th with the i-th choice of
    every group, cycling); collect every key, the dataclass fields of every `_target_` node and the choice fields."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import get_class

    from rpg.preflight.compose import CONFIG_NAME

    groups = config_groups()
    runs = [{g: cs[i % len(cs)] for g, cs in groups.items()} for i in range(max(map(len, groups.values())))]
    keys: set = set()
    targets: dict = {}
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        for run in runs:
            cfg = compose(config_name=CONFIG_NAME, overrides=[f"{g}={c}" for g, c in run.items()])
            _walk(cfg, "", keys, targets)
    fields = {}
    for path, target in sorted(targets.items()):
        try:
            cls = get_class(target)
        except Exception:  # noqa: BLE001 -- a function target (not a class): no field list
            continue
        if dataclasses.is_dataclass(cls):
            fields[path] = [target, sorted(f.name for f in dataclasses.fields(cls))]
    if POLICY_LOSS_PREFIX[:-1] in fields:  # the RPG options are checked by rpg.preflight.early
        fields.pop(POLICY_LOSS_PREFIX[:-1])
    return {"keys": sorted(keys), "fields": fields, "choices": _choice_fields()}


def write_index() -> None:
    atomic_write_text(INDEX_PATH, json.dumps(build_index(), indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m rpg.preflight.keys --write   (regenerates rpg/preflight/key_index.json)")
    write_index()
    print(f"wrote {INDEX_PATH}")
