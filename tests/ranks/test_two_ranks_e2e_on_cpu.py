"""CPU_RANKS=2 end to end: verl 0.9.1's trainer with 2 FSDP2 ranks on CPU (gloo) through the project's launcher.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` with `CPU_RANKS=2` (2 actor ranks, 2 rollout replicas); each rank
updates on its 8 of the step's 16 sequences in one micro-batch (`ppo_micro_batch_size_per_gpu` = a rank's share; the
top-k dump below sees one loss call per rank and launch). Every run logs exactly its steps: one
line each in the JSON-lines metrics file and on the console, every `actor/rpg/*` metric finite
(`cpu_trainer.check_steps`).

* the smoke run (`SMOKE=1`, rpg/smoke.py) with the periodic reference and schedule-free AdamW, with the wandb logger
  (offline), which reaches every moment that fails late: launch 1 runs step 1 and saves its checkpoint under the
  smoke folder (RPG_SMOKE_DIR), with schedule-free's HF export of the average x; launch 2 (a new process, as a user's
  resume) resumes it and runs step 2 and a validation; the periodic refresh is forced at every step (K = 1 instead of
  the recipe's 64) and each rank checks its shards: reference = actor after the refresh; the configured logger (wandb)
  is initialised; the run's CKPTS_DIR is untouched; the smoke report follows. The refresh at step 1 sets the reference
  to the policy that samples step 2 (π_old, one mini-batch per step), so at step 2 verl's own KL-loss metric (k3
  against `ref_log_prob`) and the periodic reference's KL are ~0 only if the resumed run restored the *refreshed*
  reference on both ranks; the checkpoint's HF export is the average x, bit for bit; the adaptive β
  (`kl_control=adaptive`) follows its recurrence on the all-reduced KL, and the resumed step 2 uses exactly the β the
  first launch computed after step 1 (its state restored from the checkpoint);
* the top-k KL (`kl_estimator=topk`, k = 8, bucket tail) rides on the same run, through verl's real batch path (the
  TransferQueue, the update's shuffle and re-packing into micro-batches on two ranks): each worker writes the
  micro-batches of its updates (tests/ranks/topk_dump.py, through verl's VERL_USE_EXTERNAL_MODULES), and a single
  process recomputes them from the same sequences with the policy of that step (launch 1: the tiny model; launch 2:
  the checkpoint's export, which is also the refreshed reference): the support each rank received is the
  reference's top-k at that very sequence and position (ids and log-probs), and each rank's per-token KL equals
  `rpg.topk_kl.topk_kl` of the single-process logits at that support; a support shifted by one row (the mutant of a
  mis-carried support) breaks the check. The policy is the reference at both updates (the refresh at every step), so
  the KL itself is ~1e-7 there: the support's log-probs and the shifted mutant give the check its teeth. Limitation
  of this run's data: the two rollout replicas sample the same responses for the requests of a prompt that land on
  different replicas (rpg/cpu/hf_rollout.py seeds a request by prompt and occurrence within its server), so the two
  ranks hold the same 8 sequences; a support swapped between the two ranks' copies of one sequence would pass;
Schedule-free with two optimizer steps per training step (x ≠ y, so the export is told from the iterate), the
iterative KL active and the rollout's y/x weight pushes around validation are checked in the end-to-end run of
tests/e2e/test_e2e_trainer_on_cpu.py, on one rank, without a trainer start-up of its own.

Cost: two trainer start-ups (the smoke run's two launches), ~4 min on 2 cores. Needs artifacts/tiny.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from cpu_trainer import TRAINER_TIMEOUT_S, assert_hf_export_is_x, check_steps, run_cpu_recipe

from rpg import topk_kl

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)

SIZES = dict(CPU_RANKS="2", CPU_BATCH="4", CPU_N="4", CPU_SEED="0")  # 16 sequences per step, 8 per rank
BETA_TARGET, BETA_H = 1e-4, 2.0  # the adaptive β (docs/losses.md#adaptive-beta) on the smoke run
TOPK = 8


# the smoke run's overrides, one list (a further property of the same run is one more line here)
SMOKE_OVERRIDES = [
    "trainer.logger=[console,wandb]",  # the smoke run keeps it (and adds verl's file logger); offline: WANDB_MODE
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.policy_loss.reference=periodic",
    "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps=64",  # the recipe's K: the smoke run forces K = 1
    "+actor_rollout_ref.actor.policy_loss.kl_control=adaptive",
    f"+actor_rollout_ref.actor.policy_loss.kl_target={BETA_TARGET}",
    f"+actor_rollout_ref.actor.policy_loss.kl_horizon={BETA_H}",
    "+actor_rollout_ref.actor.policy_loss.kl_estimator=topk",  # the top-k support carried across the two ranks
    f"+actor_rollout_ref.actor.policy_loss.kl_topk={TOPK}", "+actor_rollout_ref.actor.policy_loss.kl_topk_tail=bucket",
    "+actor_rollout_ref.actor.policy_loss.branch_on=advantage",  # the top-k KL has no C_KL to branch on
]
TOPK_DIRECTION = "reverse"  # rpg_reinforce_urkl's


def test_smoke_run_checkpoints_resumes_refreshes_and_exports_on_two_ranks(tiny_dir, tmp_path):
    # RPG_SMOKE_DIR=tmp_path: launch 2 logs to tmp_path/smoke_2r.jsonl, the file run_cpu_recipe reads
    smoke_dir, run_ckpts, dumps = tmp_path, tmp_path / "run-ckpts", tmp_path / "topk-dumps"
    env = dict(SMOKE="1", RPG_SMOKE_DIR=str(smoke_dir), CKPTS_DIR=str(run_ckpts), OPTIM="schedulefree",
               WANDB_MODE="offline", WANDB_DIR=str(tmp_path), **SIZES)
    env["RAY_DEDUP_LOGS"] = "0"  # Ray would merge the two ranks' similar log lines
    # every process imports tests/ranks/topk_dump.py (verl's VERL_USE_EXTERNAL_MODULES), which writes the top-k
    # micro-batches of each update under RPG_TOPK_DUMP
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env.update(VERL_USE_EXTERNAL_MODULES="topk_dump", RPG_TOPK_DUMP=str(dumps), PYTHONPATH=path)
    records, text = run_cpu_recipe(tmp_path, "smoke_2r", SMOKE_OVERRIDES, timeout_s=2 * TRAINER_TIMEOUT_S, **env)
    step1 = [json.loads(line) for line in (smoke_dir / "smoke_2r.step1.jsonl").read_text().splitlines()]
    train = check_steps(step1 + records, text, [1, 2])  # launch 1 logged step 1, launch 2 step 2
    ckpt = smoke_dir / "ckpts" / "smoke_2r" / "global_step_1"
    assert f"[rpg smoke] checkpoint of step 1 saved under the smoke folder: {ckpt} (" in text, text[-3000:]
    assert f"the run's CKPTS_DIR ({run_ckpts}) is not touched" in text and not run_ckpts.exists()
    assert f"[rpg smoke] resumed from {ckpt} in a second launch and finished step 2" in text
    assert sorted(r["step"] for r in records if "actor/pg_loss" in r["data"]) == [2]  # launch 2 began at step 2
    assert any(k.startswith("val-core/") for k in train[2]), "no validation after step 2"
    for step in (1, 2):  # forced refresh (K = 1), checked on both ranks
        assert train[step]["actor/rpg/ref_refreshed"] == 1, (step, train[step])
        for rank in (0, 1):
            line = rf"\[rpg.reference\] rank {rank}: reference = actor after the refresh at training step {step} "
            assert re.search(line + r"\(\d+ shard tensors equal", text), (step, rank)
    # the resumed reference is the step-1 policy on both ranks: zero KL on the on-policy step 2
    assert abs(train[2]["actor/kl_loss"]) < 1e-6 and abs(train[2]["actor/rpg/ref_kl"]) < 1e-6, train[2]
    assert f"[rpg.schedule_free] HF export of the average x at step 1: {ckpt / 'actor' / 'huggingface'}" in text
    assert_hf_export_is_x(ckpt / "actor", world_size=2, distinct=False)  # one optimizer step: x = y = z
    assert list((tmp_path / "wandb").glob("offline-run-*")), "the configured logger (wandb) was not initialised"
    assert "[rpg smoke] steps [1, 2]" in text and "projected wall time of the full run" in text
    # the rollout/trainer mismatch judged from verl's metrics, with the share a smoke run installs (rpg/mismatch.py)
    for step in (1, 2):
        assert train[step]["training/rollout_logp_diff_share"] == 0.0, (step, train[step])  # fp32 on CPU
    assert "[rpg smoke] rollout/trainer mismatch: |Δ probability| mean" in text, text[-3000:]
    assert "tokens with |Δ log p| > log 2: 0.000%" in text and "  verdict: OK (heuristic thresholds" in text
    # the adaptive β rides on this run: it follows its recurrence, and the resumed launch continues it exactly
    for step in (1, 2):
        kl, beta = train[step]["actor/rpg/kl_ctrl_kl"], train[step]["actor/rpg/kl_coef"]
        assert train[step]["actor/rpg/kl_coef_next"] == beta * (1 + min(max(kl / BETA_TARGET - 1, -0.2), 0.2) / BETA_H)
    assert train[1]["actor/rpg/kl_coef"] == 1e-4  # the recipe's kl_coef
    assert train[2]["actor/rpg/kl_coef"] == train[1]["actor/rpg/kl_coef_next"] != train[1]["actor/rpg/kl_coef"]
    check_topk_dumps(dumps, tiny_dir / "model", ckpt / "actor" / "huggingface")


# ---- the top-k support across the two ranks, against a single process ----------------------------------------------
def load_policy(model_dir: Path, weights_dir: Path | None = None):
    """The tiny model in fp32, eval mode; with `weights_dir`, its weights from that HF export (safetensors)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if weights_dir is not None:
        missing, unexpected = model.load_state_dict(load_file(weights_dir / "model.safetensors"), strict=False)
        assert not unexpected and all(n.endswith("lm_head.weight") for n in missing), (missing, unexpected)
        model.tie_weights()
    return model


def sequence_logits(model, record: dict, i: int) -> torch.Tensor:
    """(rows, V) fp32 logits of packed sequence i of a dumped micro-batch, scaled by its temperature as verl does."""
    a, b = record["offsets"][i].item(), record["offsets"][i + 1].item()
    ids = record["input_ids"][a:b][None]
    pos = record["position_ids"][a:b][None] if record["position_ids"] is not None else None
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=pos).logits[0].float()
    t = record["temperature"]
    t = float(t[i]) if isinstance(t, torch.Tensor) and t.ndim else float(t)
    return logits / t


def check_topk_dumps(dumps: Path, model_dir: Path, export_dir: Path) -> None:
    records = [torch.load(f, weights_only=False) for f in sorted(dumps.glob("*.pt"))]
    seen = {(r["phase"], r["rank"]) for r in records}
    assert seen == {(p, r) for p in ("save", "resume") for r in (0, 1)}, seen  # both launches, both ranks
    policies = {"save": load_policy(model_dir), "resume": load_policy(model_dir, export_dir)}
    worst = {"log_probs": 0.0, "kl": 0.0, "verl": 0.0, "shifted": float("inf")}
    for r in records:
        model = policies[r["phase"]]
        for i in range(len(r["offsets"]) - 1):
            a, b = r["offsets"][i].item(), r["offsets"][i + 1].item()
            logits = sequence_logits(model, r, i)
            log_p = torch.log_softmax(logits, -1)
            ids, lps = r["ids"][a:b], r["log_probs"][a:b]
            # the support this rank received is the reference's top-k at this very sequence and position
            top = log_p.topk(TOPK, -1).values
            worst["log_probs"] = max(worst["log_probs"], (top - lps).abs().max().item(),
                                     (log_p.gather(-1, ids.long()) - lps).abs().max().item())
            # the rank's per-token KL is the single process's at that support
            want = topk_kl.topk_kl(logits, topk_kl.Support(ids, lps), TOPK_DIRECTION, "bucket").kl
            worst["kl"] = max(worst["kl"], (want - r["kl"][a:b]).abs().max().item())
            labels = r["input_ids"][a + 1:b]  # verl's log_probs row t is the next token's
            verl = log_p[:-1].gather(-1, labels[:, None].long())[:, 0]
            worst["verl"] = max(worst["verl"], (verl - r["verl_log_probs"][a:b - 1]).abs().max().item())
            if b - a > 2:  # the mutant: a support carried one row off
                off = topk_kl.Support(ids.roll(1, 0), lps.roll(1, 0))
                shifted = topk_kl.topk_kl(logits, off, TOPK_DIRECTION, "bucket").kl
                worst["shifted"] = min(worst["shifted"], (shifted - r["kl"][a:b]).abs().max().item())
    print(f"[topk across ranks] {len(records)} micro-batches, worst |Δ|: {worst}")
    assert worst["log_probs"] < 1e-4 and worst["kl"] < 1e-5 and worst["verl"] < 1e-4, worst
    assert worst["shifted"] > 1e-2, worst  # the check would see a support carried one row off
