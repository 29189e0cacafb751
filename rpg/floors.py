"""The import floors of the package, top to bottom: a module imports only modules of its own floor or a lower one, and
no import (function-local ones included) closes a cycle. tests/test_layers_on_cpu.py reads this table, parses every
module of rpg/ and names each arrow up and each cycle; a new module needs a row here (docs/README.md#layout).

A floor is a name, what it holds and its modules: dotted names, or `pkg.*` for a folder (its `__init__` and every
module in it). A module's floor is the floor that names it exactly, else the one with the longest `pkg.*` that matches
it. The folders apart from the stack sit where their imports put them: rpg/tools/ (console scripts) on top, nothing
imports them; rpg/cpu/ (the CPU platform, hf rollout, vLLM-on-CPU patches, loaded only by CPU runs through
VERL_USE_EXTERNAL_MODULES) beside the plugin entry point; rpg/data/ (reward routing, no rpg import) at the bottom.
"""

from __future__ import annotations

from typing import NamedTuple


class Floor(NamedTuple):
    name: str
    holds: str
    modules: str  # space-separated dotted names and `pkg.*` patterns


FLOORS = (
    Floor("tools", "console scripts (rpg-prepare-data, rpg-report, ...)", "rpg.tools.*"),
    Floor("launch", "the entry: compose, checks, dry run, smoke, launch", "rpg.launch rpg.smoke rpg.ray_start"),
    Floor("preflight", "the checks before Ray, the recipe knobs, the recipe table", "rpg.preflight.* rpg.recipe_table"),
    Floor("plugin", "verl's entry point; the CPU platform verl loads beside it", "rpg.verl_plugin rpg.cpu.*"),
    Floor(
        "losses",
        "both loss families, their terms, the advantages",
        "rpg.losses rpg.kl_addon rpg.topk_loss rpg.advantages",
    ),
    Floor("install", "what RPG_INSTALL installs in verl (it imports the installers by name)", "rpg.install"),
    # rpg.preflight.resume_ckpt (verl's resume folder and the files a resume reads) is read by schedule_free's resume
    # check in the worker too, so it sits with the runtime; it imports only the run-mode table
    Floor(
        "runtime",
        "verl adapters: reference modes, schedule-free, top-k hook, mismatch, DAPO's filter",
        "rpg.reference.* rpg.schedule_free rpg.schedule_free_worker rpg.schedule_free_trainer rpg.topk_hook rpg.mismatch "
        "rpg.dynamic_sampling rpg.replay_buffer rpg.preflight.resume_ckpt",
    ),
    Floor(
        "patches",
        "the table of verl patch points that the runtime's adapters wrap, and the micro-batch record its wrappers open",
        "rpg.patches rpg.reference.micro_batch",
    ),
    Floor("config", "RPGPolicyLossConfig, and the package's lazy re-export of it", "rpg rpg.loss_config"),
    Floor(
        "tables",
        "loss table, RPG options, KL aggregation, add-on bases",
        "rpg.loss_table rpg.loss_options rpg.kl_aggregation rpg.addon_bases",
    ),
    Floor("divergences", "the divergences, the KL pieces built on them", "rpg.divergences rpg.kl_credit rpg.topk_kl"),
    Floor(
        "base",
        "version guards, the atomic writer, DTensor shards, reward routing, the run-mode table (pure data: the divergences' top-k tails "
        "read it), verl's LoRA settings (the launcher's checks and the worker's LoRA reference read them), this table",
        "rpg.compat rpg.atomic rpg.shards rpg.data.* rpg.modes rpg.preflight.lora_config rpg.floors",
    ),
)


def floor_of(module: str) -> int | None:
    """The index of `module`'s floor in FLOORS (0: the top), or None when no row names it."""
    best, best_len = None, -1
    for i, floor in enumerate(FLOORS):
        for name in floor.modules.split():
            if name == module:
                return i
            package = name[:-2]
            within = module == package or module.startswith(package + ".")
            if name.endswith(".*") and within and len(name) > best_len:
                best, best_len = i, len(name)
    return best
