"""A resume that cannot fail late (rpg/preflight/resume_ckpt.py): the checkpoint a launch would resume from is checked
before Ray for every file verl 0.9.1 and rpg write for the run's world size and modes, and for a reference state the
worker would refuse (a LoRA periodic state without the adapter snapshot, or LoRA against full weights). Checkpoint
folders are fabricated with the file names verl's FSDPCheckpointManager and rpg.reference.periodic write (named here
literally, not from the module under test); the launcher's hook is tested in
tests/recipes/test_launch_inputs_on_cpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rpg.preflight import resume_ckpt

ONE_RANK = ["actor/model_world_size_1_rank_0.pt", "actor/optim_world_size_1_rank_0.pt",
            "actor/extra_state_world_size_1_rank_0.pt", "data.pt"]  # fmt: skip


def config(folder: Path, ranks: int = 1, mode: str = "auto", **loss) -> object:
    return OmegaConf.create({
        "algorithm": {"adv_estimator": "rpg"}, "critic": {"enable": None},
        "trainer": {"n_gpus_per_node": ranks, "nnodes": 1, "resume_mode": mode, "resume_from_path": None,
                    "default_local_dir": str(folder), "v1": {"trainer_mode": "sync"}},
        "actor_rollout_ref": {"actor": {"checkpoint": {"save_contents": ["model", "optimizer", "extra"],
                                                       "load_contents": "${.save_contents}"},
                                        "policy_loss": {"reference": "iterative", "kl_control": "fixed", **loss}}},
    })  # fmt: skip


def save(folder: Path, step: int, files: list[str], latest: bool = True) -> Path:
    step_dir = folder / f"global_step_{step}"
    for rel in files:
        (step_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (step_dir / rel).write_bytes(b"x")
    if latest:
        (folder / "latest_checkpointed_iteration.txt").write_text(str(step))
    return step_dir


def test_a_missing_extra_state_is_named_with_the_resume_command_for_the_previous_checkpoint(tmp_path):
    previous = save(tmp_path, 1, ONE_RANK)
    latest = save(tmp_path, 2, ONE_RANK)
    cfg = config(tmp_path)
    assert resume_ckpt.problem(cfg) is None  # complete: resumed as verl would
    (latest / "actor/extra_state_world_size_1_rank_0.pt").unlink()  # a kill mid-save
    why = resume_ckpt.problem(cfg)
    assert f"{latest} lacks actor/extra_state_world_size_1_rank_0.pt (actor extra state of rank 0)" in why, why
    assert f"trainer.resume_mode=resume_path trainer.resume_from_path={previous}" in why, why
    (latest / "data.pt").unlink()
    assert "data.pt (the data loader's state)" in resume_ckpt.problem(cfg)
    (previous / "actor/model_world_size_1_rank_0.pt").unlink()
    assert "No complete checkpoint" in resume_ckpt.problem(cfg) and "trainer.resume_mode=disable" in resume_ckpt.problem(cfg)


def test_nothing_to_resume_is_not_checked(tmp_path):
    save(tmp_path, 2, ["data.pt"], latest=False)  # no tracker: verl starts from scratch
    assert resume_ckpt.problem(config(tmp_path)) is None
    assert resume_ckpt.problem(config(tmp_path, mode="disable")) is None
    assert resume_ckpt.problem(config(tmp_path / "absent")) is None


def test_every_rank_of_the_world_size_and_a_resume_path(tmp_path):
    two = [f"actor/{kind}_world_size_2_rank_{r}.pt" for kind in ("model", "optim", "extra_state") for r in (0, 1)]
    target = save(tmp_path, 3, [*two, "data.pt"])
    assert resume_ckpt.problem(config(tmp_path, ranks=2)) is None
    why = resume_ckpt.problem(config(tmp_path, ranks=4))  # saved by 2 ranks, resumed by 4
    assert "model_world_size_4_rank_0.pt" in why and "and 8 more" in why and "saved by 2 ranks and this run has 4" in why
    (target / "actor/optim_world_size_2_rank_1.pt").unlink()
    cfg = config(tmp_path, ranks=2, mode="resume_path")
    cfg.trainer.resume_from_path = str(target)
    assert "lacks actor/optim_world_size_2_rank_1.pt (actor optimizer state of rank 1)" in resume_ckpt.problem(cfg)
    cfg.actor_rollout_ref.actor.checkpoint.save_contents = ["model", "extra"]  # load_contents follows: no optimizer
    assert resume_ckpt.problem(cfg) is None
    cfg.algorithm.adv_estimator = "gae"  # a critic (verl's need_critic): its shards are read too
    assert "lacks critic/model_world_size_2_rank_0.pt (critic model state of rank 0)" in resume_ckpt.problem(cfg)


def test_the_reference_and_beta_state_of_the_runs_modes(tmp_path):
    latest = save(tmp_path, 2, ONE_RANK)
    ema = config(tmp_path, reference="ema", kl_control="adaptive")
    why = resume_ckpt.problem(ema)
    assert "actor/rpg_reference/state.json (the ema reference's state)" in why, why
    assert "actor/rpg_kl_control.json (the adaptive β controller's state)" in why, why
    (latest / "actor/rpg_reference").mkdir()
    (latest / "actor/rpg_reference/state.json").write_text(json.dumps({"has_ref_weights": True}))
    (latest / "actor/rpg_kl_control.json").write_text("{}")
    assert "actor/rpg_reference/ref_model/.metadata (the ema reference's weights)" in resume_ckpt.problem(ema)
    save(tmp_path, 2, ["actor/rpg_reference/ref_model/.metadata"])
    assert resume_ckpt.problem(ema) is None
    assert resume_ckpt.problem(config(tmp_path)) is None  # an iterative run reads none of them
    cfg = config(tmp_path)
    cfg.trainer.v1.trainer_mode = "separate_async"
    assert "transfer_queue (the asynchronous trainer's in-flight prompts)" in resume_ckpt.problem(cfg)


def test_the_schedule_free_trainer_is_synchronous(tmp_path):
    """rpg.schedule_free's trainer (trainer_mode=schedule_free_sync) reports "sync" to verl, which then writes no
    transfer_queue/ (the 2-rank smoke run resumed a schedule-free checkpoint): not asked for."""
    save(tmp_path, 2, ONE_RANK)
    cfg = config(tmp_path)
    cfg.trainer.v1.trainer_mode = "schedule_free_sync"
    assert resume_ckpt.problem(cfg) is None


REFERENCE_STATE = "actor/rpg_reference/state.json"
ADAPTER_SNAPSHOT = "actor/rpg_reference/ref_model/.metadata"


def lora_periodic(folder: Path, lora_rank: int = 4) -> object:
    cfg = config(folder, reference="periodic")
    cfg.actor_rollout_ref.model = {"lora_rank": lora_rank}  # verl's FSDP engine's setting (rpg.preflight.lora_config)
    return cfg


def save_reference(step_dir: Path, weights: bool = True, **state) -> None:
    """rpg.reference.written's files, as a LoRA periodic run writes them unless `state` says otherwise."""
    (step_dir / "actor/rpg_reference").mkdir(parents=True, exist_ok=True)
    payload = {"version": 1, "reference": "periodic", "has_ref_weights": True, "lora_snapshot": True, **state}
    (step_dir / REFERENCE_STATE).write_text(json.dumps(payload))
    if weights:
        save(step_dir.parent, int(step_dir.name.split("_")[-1]), [ADAPTER_SNAPSHOT], latest=False)


def test_a_lora_periodic_resume_without_the_adapter_snapshot_is_refused_before_launch(tmp_path):
    """The worker refuses these at load (rpg.reference.written), after Ray and the model started; the launcher
    refuses them first, naming the checkpoint's state file and the fix (issue 40, item 2)."""
    cfg = lora_periodic(tmp_path)
    previous = save(tmp_path, 1, ONE_RANK, latest=False)
    save_reference(previous)
    latest = save(tmp_path, 2, ONE_RANK)
    save_reference(latest)
    assert resume_ckpt.problem(cfg) is None  # the snapshot and its state: resumed as the worker would
    state = latest / REFERENCE_STATE
    save_reference(latest, weights=False, has_ref_weights=False)  # no snapshot: the policy's adapter would be π_ref
    why = resume_ckpt.problem(cfg)
    assert why is not None and str(state) in why and "has_ref_weights=false" in why, why
    assert "adapter snapshot" in why and f"trainer.resume_from_path={previous}" in why, why
    save_reference(latest, lora_snapshot=False)  # saved by a full-weight run: ref_model/ is a whole model
    why = resume_ckpt.problem(cfg)
    assert why is not None and str(state) in why and "lora_snapshot=false" in why and "without LoRA" in why, why
    assert "actor_rollout_ref.model.lora_rank" in why and f"trainer.resume_from_path={previous}" in why, why
    save_reference(latest)
    (latest / ADAPTER_SNAPSHOT).unlink()  # the state says it was saved, its files are gone
    why = resume_ckpt.problem(cfg)
    assert f"{latest} lacks {ADAPTER_SNAPSHOT} (the periodic reference's LoRA adapter snapshot)" in why, why
    (previous / ADAPTER_SNAPSHOT).unlink()
    why = resume_ckpt.problem(cfg)
    assert "No complete checkpoint" in why and "trainer.resume_mode=disable" in why, why


def test_a_lora_snapshot_is_refused_by_a_full_weight_resume_and_the_rank_read_as_verl_reads_it(tmp_path):
    latest = save(tmp_path, 2, ONE_RANK)
    save_reference(latest)  # saved with LoRA
    full = config(tmp_path, reference="periodic")
    why = resume_ckpt.problem(full)
    assert why is not None and str(latest / REFERENCE_STATE) in why and "lora_snapshot=true" in why, why
    assert "with LoRA" in why and "trainer.resume_mode=disable" in why, why
    assert resume_ckpt.problem(lora_periodic(tmp_path)) is None
    block = config(tmp_path, reference="periodic")
    block.actor_rollout_ref.model = {"lora": {"rank": 8}}  # verl's newer setting, read first
    assert resume_ckpt.problem(block) is None
    save_reference(latest, lora_snapshot=False)
    assert resume_ckpt.problem(full) is None
    assert "lora_snapshot=false" in resume_ckpt.problem(block)
    assert resume_ckpt.problem(config(tmp_path)) is None  # an iterative run reads no reference state
