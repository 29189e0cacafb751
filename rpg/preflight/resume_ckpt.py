"""A resume that cannot fail late: the checkpoint a launch would resume from is checked for completeness before Ray.

verl 0.9.1's `_load_checkpoint` (trainer/ppo/v1/trainer_base.py) resumes `trainer.resume_mode=auto` from the folder
named by `<trainer.default_local_dir>/latest_checkpointed_iteration.txt` and `resume_path` from
`trainer.resume_from_path`. A file missing there (a kill mid-save, a full disk, a node-local disk) is found only when
the workers load it: on CPU 56 s after the launch, on a GPU node minutes after model load and vLLM start (issue 33:
`FileNotFoundError: …/global_step_2/actor/extra_state_world_size_1_rank_0.pt`). This module lists what a resume
reads, for the run's world size (`trainer.n_gpus_per_node × trainer.nnodes`: verl's global pool, where the actor's
ranks live) and modes:

* per actor rank r of W, from verl's `FSDPCheckpointManager` (utils/checkpoint/fsdp_checkpoint_manager.py) as
  `actor.checkpoint.load_contents` selects them: `actor/model_world_size_W_rank_r.pt` (`model`),
  `actor/optim_world_size_W_rank_r.pt` (`optimizer`), `actor/extra_state_world_size_W_rank_r.pt` (`extra`: the LR
  scheduler and RNG states);
* the critic's three files per rank under `critic/` when the run has one (verl's `need_critic`: GAE, or
  `critic.enable`);
* `data.pt`, the data loader's state (verl only warns without it and restarts the data order from the beginning);
* `transfer_queue/`, the in-flight prompts, in the asynchronous trainer modes (`trainer.v1.trainer_mode`);
* this project's, by the names their writers save them under (`rpg.reference.written`, `rpg.reference.adaptive_kl`):
  `actor/rpg_reference/state.json` for `reference=periodic|ema`, and its `ref_model/` weights
  (torch.distributed.checkpoint's `.metadata`) when that state says they were saved; `actor/rpg_kl_control.json`
  (β's state) for `kl_control=adaptive`.

The reference's state is also read for what the worker would refuse at load (`rpg.reference.written`,
docs/reference-modes.md#lora): a state saved with the LoRA adapter snapshot (``lora_snapshot``) resumed by a run
without LoRA, or the reverse (`rpg.preflight.lora_config`: verl's reading of the run's LoRA settings), and a LoRA
state without the snapshot (``has_ref_weights`` false: resuming would take the policy's adapter as the reference).

`problem(config)` names what is missing or refused and the override that resumes from the newest complete checkpoint
of the folder (or `trainer.resume_mode=disable`), None when the resume is complete or there is nothing to resume. A
launch with `RAY_ADDRESS` whose checkpoint folder is not visible here is not checked (the TaskRunner reads it
elsewhere).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional

from rpg import modes
from rpg.preflight.lora_config import lora_settings
from rpg.reference import adaptive_kl, written

TRACKER = "latest_checkpointed_iteration.txt"  # verl: checkpoint_manager.get_checkpoint_tracker_filename
STEP_DIR = re.compile(r"^global_step_(\d+)$")
SHARD_FILE = re.compile(r"^(?:model|optim|extra_state)_world_size_(\d+)_rank_\d+\.pt$")  # verl's, any world size
ACTOR = "actor"
RANK_FILES = {"model": "model", "optimizer": "optim", "extra": "extra_state"}  # load_contents entry -> file prefix
REFERENCE_STATE = f"{ACTOR}/{written.STATE_DIR}/{written.STATE_FILE}"  # the names of their writers
REFERENCE_WEIGHTS = f"{ACTOR}/{written.STATE_DIR}/{written.REF_MODEL_DIR}/{written.REF_MODEL_INDEX}"
KL_CONTROL = f"{ACTOR}/{adaptive_kl.KL_CONTROL_FILE}"
SHOWN = 4  # missing files named in full; the rest counted


def world_size(config: Any) -> int:
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)


def _policy_loss(config: Any) -> Any:
    return config.actor_rollout_ref.actor.get("policy_loss", None) or {}


def expected(config: Any, step_dir: Path) -> list[tuple[str, str]]:
    """(path relative to `step_dir`, what it holds) for every piece a resume of `config` reads."""
    w = world_size(config)
    pieces = _rank_pieces(ACTOR, config.actor_rollout_ref.actor.get("checkpoint", None), w)
    if _needs_critic(config):  # verl's need_critic; the critic shares the actor's pool and file names
        pieces += _rank_pieces("critic", (config.get("critic", None) or {}).get("checkpoint", None), w)
    pieces.append(("data.pt", "the data loader's state"))
    if modes.trainer_mode(config).saves_transfer_queue:  # the trainer-mode table's row (rpg/modes.py)
        pieces.append(("transfer_queue", "the asynchronous trainer's in-flight prompts"))
    reference, control = modes.selected(_policy_loss(config))  # the run-mode table's rows (rpg/modes.py)
    if reference.writes_reference:
        pieces.append((REFERENCE_STATE, f"the {reference.name} reference's state"))
        if _saved_reference_weights(step_dir / REFERENCE_STATE):
            weights = "LoRA adapter snapshot" if lora_settings(config).enabled else "weights"
            pieces.append((REFERENCE_WEIGHTS, f"the {reference.name} reference's {weights}"))
    if control.moves_beta:
        pieces.append((KL_CONTROL, f"the {control.name} β controller's state"))
    return pieces


def _rank_pieces(role: str, checkpoint: Any, w: int) -> list[tuple[str, str]]:
    """(path, what) of the per-rank files of `role` (actor or critic) that its `checkpoint.load_contents` loads."""
    checkpoint = checkpoint or {}
    contents = checkpoint.get("load_contents", None) or checkpoint.get("save_contents", None) or RANK_FILES
    return [
        (f"{role}/{RANK_FILES[c]}_world_size_{w}_rank_{r}.pt", f"{role} {c} state of rank {r}")
        for c in RANK_FILES
        if c in contents
        for r in range(w)
    ]


def _needs_critic(config: Any) -> bool:
    enable = (config.get("critic", None) or {}).get("enable", None)
    return bool(enable) if enable is not None else str(config.algorithm.get("adv_estimator", "")) == "gae"


def _reference_state(state: Path) -> Optional[dict]:
    """The reference's saved state, None when absent or unreadable (the missing file is reported by `missing`; the
    worker refuses a corrupt one, naming it)."""
    try:
        payload = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def _saved_reference_weights(state: Path) -> bool:
    return bool((_reference_state(state) or {}).get(written.HAS_REF_WEIGHTS, False))


def missing(config: Any, step_dir: Path) -> list[tuple[str, str]]:
    return [(rel, what) for rel, what in expected(config, step_dir) if not (step_dir / rel).exists()]


def refused_reference(config: Any, step_dir: Path) -> Optional[str]:
    """Why the worker would refuse the reference state of `step_dir` for this run at load (`rpg.reference.written`):
    saved with or without the LoRA adapter snapshot against the run's LoRA setting, or a LoRA state without the
    snapshot; None when it loads (or the run writes no reference, or the state is absent: `missing` names it)."""
    reference = modes.selected(_policy_loss(config))[0]
    path = step_dir / REFERENCE_STATE
    state = _reference_state(path) if reference.writes_reference else None
    if state is None:
        return None
    lora = lora_settings(config).enabled
    saved_lora = state.get(written.LORA_SNAPSHOT, False) is True  # files from before the LoRA reference: False
    if saved_lora != lora:
        saved, run = ("with", "without") if saved_lora else ("without", "with")
        fix = ("actor_rollout_ref.model.lora_rank (or lora.rank) > 0" if saved_lora
               else "actor_rollout_ref.model.lora_rank=0, no lora.rank and no lora_adapter_path")
        return (
            f"{path} says {written.LORA_SNAPSHOT}={json.dumps(saved_lora)}: it was saved {saved} LoRA and this run is "
            f"{run} it (its reference is {'an adapter snapshot' if saved_lora else 'a full model'} there). Resume "
            f"with the LoRA setting it was saved with ({fix})"
        )
    if lora and state.get(written.HAS_REF_WEIGHTS) is not True:
        return (
            f"{path} says {written.HAS_REF_WEIGHTS}={json.dumps(state.get(written.HAS_REF_WEIGHTS))}: no adapter "
            f"snapshot of the {reference.name} reference was saved, and resuming would take the policy's adapter as "
            "the reference"
        )
    return None


def resume_target(config: Any) -> Optional[Path]:
    """The folder verl would resume from (its `_load_checkpoint` rules), None when it would start from scratch."""
    mode = str(config.trainer.get("resume_mode", "auto"))  # verl's default
    if mode == "resume_path":
        path = config.trainer.get("resume_from_path", None)
        return Path(os.path.abspath(path)) if isinstance(path, str) else None  # relative: to the working directory
    if mode != "auto" or not config.trainer.get("default_local_dir", None):
        return None
    folder = Path(os.path.abspath(str(config.trainer.default_local_dir)))
    try:
        step = int((folder / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None  # no tracker (or an unreadable one): verl trains from scratch
    target = folder / f"global_step_{step}"
    return target if target.is_dir() else None


def complete_checkpoints(config: Any, folder: Path) -> list[Path]:
    """The complete global_step_N folders of `folder` (nothing missing, nothing the worker refuses), newest first."""
    numbered = ((STEP_DIR.match(p.name), p) for p in folder.iterdir() if p.is_dir())
    steps = sorted(((int(m.group(1)), p) for m, p in numbered if m), reverse=True)
    return [p for _, p in steps if not missing(config, p) and not refused_reference(config, p)]


def _saved_world_sizes(actor: Path) -> list[int]:
    names = (f.name for f in (actor.iterdir() if actor.is_dir() else ()))
    return sorted({int(m.group(1)) for m in map(SHARD_FILE.match, names) if m})


def problem(config: Any) -> Optional[str]:
    """Why the checkpoint this launch would resume from cannot be resumed (what is missing, and the override that
    resumes from the newest complete one), or None."""
    target = resume_target(config)
    if target is None or not target.is_dir():  # nothing to resume, or a path rpg.preflight.inputs reports
        return None
    gone = missing(config, target)
    refused = None if gone else refused_reference(config, target)
    if not gone and not refused:
        return None
    w = world_size(config)
    mode = f"trainer.resume_mode={config.trainer.resume_mode}"
    if refused:
        lines = [f"the checkpoint this launch would resume from ({mode}) cannot be resumed by this run (its worker "
                 f"would refuse it only after Ray, the workers and the model had started): {refused}."]
    else:
        names = ", ".join(f"{rel} ({what})" for rel, what in gone[:SHOWN])
        more = f" and {len(gone) - SHOWN} more" if len(gone) > SHOWN else ""
        lines = [
            f"the checkpoint this launch would resume from ({mode}) is incomplete: {target} lacks {names}{more}. verl "
            "would find this only after Ray, the workers and the model had started (a kill mid-save, a full disk or a "
            "node-local disk leaves such a folder)."
        ]
    saved = _saved_world_sizes(target / ACTOR)
    if saved and w not in saved:
        lines.append(f"Its actor shards were saved by {' or '.join(map(str, saved))} ranks and this run has {w} "
                     "(trainer.n_gpus_per_node × trainer.nnodes): resume with the cluster shape it was saved with.")
    earlier = [p for p in complete_checkpoints(config, target.parent) if p != target]
    if earlier:
        lines.append(f"Resume from the newest complete checkpoint instead: add trainer.resume_mode=resume_path "
                     f"trainer.resume_from_path={earlier[0]} (this folder is left as it is).")
    else:
        lines.append(f"No complete checkpoint is in {target.parent}: start the run over with "
                     "trainer.resume_mode=disable (or another CKPTS_DIR).")
    return " ".join(lines)

