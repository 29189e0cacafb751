"""The cross-rank pieces of the periodic reference and of schedule-free AdamW on 2 gloo ranks (verl's FSDP2 engine).

Two spawned ranks (tests/ranks/rank_pool.py) build verl's real fused `ActorRolloutRefWorker` (FSDP2 actor +
reference, fp32) and train like verl's trainer: per training step each rank gets its half of an 8-sequence batch,
computes π_old and π_ref, and updates with 2 mini-batches (2 optimizer steps) of 2 micro-batches each.

Periodic reference (rpg/reference/periodic.py), RPG-REINFORCE-URKL against the reference:
* by K (K = 3 optimizer steps): refreshes at the end of training steps 2, 4, 6 on *both* ranks; after a refresh each
  rank's own reference shards equal its actor shards bit for bit and verl's reference forward gives the actor's
  log-probs; the KL the schedule sees is the all-reduced token mean (Σ KL / Σ tokens over both ranks), identical on
  both ranks, although the ranks' local KLs differ;
* by κ: κ is set between the two ranks' *local* step-1 KLs, so a rank-local criterion would refresh one rank and not
  the other; both ranks refresh together, at the same steps;
* checkpoint at step 3 → fresh workers load it: the same schedule and the same reference shards on each rank, the
  same refreshes afterwards and the same final reference as the uninterrupted run.

LoRA (rpg/reference/lora.py; verl's fused worker with lora_rank > 0, no reference engine), the periodic reference as a
snapshot of the policy's adapter, with the top-k KL and the adaptive β: both ranks refresh together; each rank's
snapshot shards equal its adapter shards after a refresh; every reference pass leaves the policy's adapter as it was;
the reference pass (and its top-k support) is the snapshot's; the rollout's weight sync after a reference pass reads
the policy's adapter (lora.merge=False: its tensors; True: its merged weights, bit for bit); β follows its recurrence on both ranks; a checkpoint resumed in fresh workers continues
identically.

EMA reference and adaptive β (rpg/reference/weights.py, adaptive_kl.py), RPG-REINFORCE-URKL with ρ = π_ref/π_old:
* τ = 0.9, one update per training step: after every step each rank's own reference shards equal the float64 closed
  form τ·ref + (1 − τ)·actor; the β controller (target below the KL: β grows) follows its recurrence on the
  all-reduced KL, identically on both ranks; a checkpoint at step 2 resumed in fresh workers restores the reference
  shards and β bit for bit and continues with the same β and reference;
* τ = 0 with period 1 gives the same reference and KLs, bit for bit, as periodic with K = 2 (one training step).

Schedule-free (rpg/schedule_free.py): the first micro-batch of every step has ratio 1 on each rank; the
switch to the average x changes every rank's shards to schedulefree's x and back to y bit-exactly; the checkpoint
holds y, its HF export is x; a resumed worker continues bit-identically.

Cost: ~1.5 min on 2 cores (the LoRA scenario ~10 s of it) (the pool is shared with tests/ranks/test_aggregation_engine_on_cpu.py).
"""

from __future__ import annotations

import math

import pytest

from engine_scenarios import ema_reference, lora_periodic, periodic_refresh, schedule_free

K_STEPS = 6


@pytest.fixture(scope="module")
def periodic_by_k(two_ranks, tiny_qwen2_dir, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("periodic_k") / "global_step_3" / "actor")
    return two_ranks.run(
        periodic_refresh, model_dir=tiny_qwen2_dir, ckpt_dir=ckpt, refresh_steps=3, refresh_kl=0.0, steps=K_STEPS,
        save_at=3,
    )


def test_refresh_by_k_on_every_rank_together(periodic_by_k):
    for rank, out in enumerate(periodic_by_k):
        refreshed = [s["step"] for s in out["steps"] if s["ref_refreshed"]]
        assert refreshed == [2, 4, 6], f"rank {rank}: refreshes at {refreshed}"
        for s in out["steps"]:
            if s["ref_refreshed"]:
                assert s["shards_equal"], f"rank {rank} step {s['step']}: reference shards != actor shards"
                assert s["logprob_gap"] < 1e-6, f"rank {rank} step {s['step']}: {s['logprob_gap']}"


def test_the_kl_is_reduced_over_ranks(periodic_by_k):
    r0, r1 = periodic_by_k
    for a, b in zip(r0["steps"], r1["steps"]):
        assert a["ref_kl"] == b["ref_kl"] and a.get("ref_kl_ema") == b.get("ref_kl_ema")  # bitwise the same
        expected = (a["local_kl_sum"] + b["local_kl_sum"]) / (a["local_tokens"] + b["local_tokens"])
        assert math.isclose(a["ref_kl"], expected, rel_tol=1e-12)
        assert a["local_tokens"] != b["local_tokens"] or a["local_kl"] != b["local_kl"]  # the ranks saw other data
    pairs = zip(r0["steps"], r1["steps"])
    assert any(abs(a["local_kl"] - b["local_kl"]) > 0.1 * max(a["local_kl"], b["local_kl"]) for a, b in pairs)


def test_checkpoint_and_resume_on_every_rank(periodic_by_k):
    for rank, out in enumerate(periodic_by_k):
        assert out["loaded_schedule"] == out["saved_schedule"], f"rank {rank}"
        assert out["saved_ref_differs_from_initial"], f"rank {rank}: nothing was refreshed before the checkpoint"
        assert out["loaded_ref_equal_saved"], f"rank {rank}: the resumed reference shards differ from the saved ones"
        assert [s["step"] for s in out["resumed_steps"] if s["ref_refreshed"]] == [4, 6], f"rank {rank}"
        assert out["resumed_final_schedule"] == out["final_schedule"], f"rank {rank}"
        assert out["resumed_ref_max_diff"] < 1e-6, f"rank {rank}: {out['resumed_ref_max_diff']}"


def test_refresh_by_kl_threshold_is_a_joint_decision(periodic_by_k, two_ranks, tiny_qwen2_dir, tmp_path):
    # κ between the two ranks' local KLs of step 1 (the same weights and data as here): a rank-local criterion would
    # refresh exactly one of the two ranks
    first = [out["steps"][0]["local_kl"] for out in periodic_by_k]
    kappa = sum(first) / 2
    assert min(first) < kappa < max(first)
    unused = str(tmp_path / "unused")
    runs = two_ranks.run(
        periodic_refresh, model_dir=tiny_qwen2_dir, ckpt_dir=unused, refresh_steps=0, refresh_kl=kappa, steps=4
    )
    r0, r1 = ([s["step"] for s in out["steps"] if s["ref_refreshed"]] for out in runs)
    assert r0 == r1, f"rank 0 refreshed at {r0}, rank 1 at {r1}"
    assert r0, "κ never fired"
    for out in runs:
        for s in out["steps"]:
            assert s["ref_refreshed"] == (s["ref_kl"] > kappa)
            if s["ref_refreshed"]:
                assert s["shards_equal"] and s["logprob_gap"] < 1e-6


P = "+actor_rollout_ref.actor.policy_loss."
TAU, TARGET, HORIZON = 0.9, 1e-5, 2.0
EMA = [f"{P}reference=ema", f"{P}ref_ema_decay={TAU}", f"{P}ref_ema_period=2"]
EMA_BETA = EMA + [f"{P}kl_control=adaptive", f"{P}kl_target={TARGET}", f"{P}kl_horizon={HORIZON}"]


@pytest.fixture(scope="module")
def ema_run(two_ranks, tiny_qwen2_dir, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("ema") / "global_step_2" / "actor")
    return two_ranks.run(
        ema_reference, model_dir=tiny_qwen2_dir, ckpt_dir=ckpt, reference=EMA_BETA, steps=4, decay=TAU, save_at=2
    )


def test_the_ema_blend_is_the_closed_form_on_every_rank(ema_run):
    for rank, out in enumerate(ema_run):
        for s in out["steps"] + out["resumed_steps"]:
            assert s["ref_ema_updated"] == 1 and s["ref_ema_update_count"] == s["step"], (rank, s)
            assert s["blend_err"] < 1e-6, (rank, s["step"], s["blend_err"])  # fp32 rounding of the float64 form
            # SMOKE=1's check in the worker ran on this rank: Σ new = τ·Σ old + (1 − τ)·Σ actor (float64, rel. 1e-6)
            assert s["worker_blend_check"] is not None and s["worker_blend_check"] <= 1e-6, (rank, s)
            assert s["moved"] > 1e-5 and s["gap_to_actor"] > 1e-5, (rank, s)  # it moved, and not onto the actor


def test_the_adaptive_beta_follows_its_recurrence_on_every_rank(ema_run):
    r0, r1 = ema_run
    for a, b in zip(r0["steps"] + r0["resumed_steps"], r1["steps"] + r1["resumed_steps"]):
        assert (a["kl_coef"], a["kl_coef_next"], a["kl_ctrl_kl"]) == (b["kl_coef"], b["kl_coef_next"], b["kl_ctrl_kl"])
    assert r0["steps"][0]["kl_coef"] == 0.05
    for steps in (r0["steps"], r0["resumed_steps"]):  # the uninterrupted run (steps 1-4), the resumed one (3-4)
        for s, nxt in zip(steps, steps[1:] + [None]):
            error = min(max(s["kl_ctrl_kl"] / TARGET - 1, -0.2), 0.2)
            assert s["kl_coef_next"] == s["kl_coef"] * (1 + error / HORIZON)
            if nxt is not None:
                assert nxt["kl_coef"] == s["kl_coef_next"]
    assert r0["steps"][-1]["kl_coef"] > 0.05 * 1.05  # the KL exceeds the tiny target: β grew


def test_ema_and_beta_checkpoint_and_resume_on_every_rank(ema_run):
    for rank, out in enumerate(ema_run):
        assert out["loaded_ref_equal_saved"] and out["saved_ref_differs_from_initial"], f"rank {rank}"
        assert out["loaded_beta_equal_saved"], f"rank {rank}"
        assert out["resumed_ref_max_diff"] < 1e-6, f"rank {rank}: {out['resumed_ref_max_diff']}"
        uninterrupted, resumed = out["steps"][2:], out["resumed_steps"]
        assert resumed[0]["kl_coef"] == uninterrupted[0]["kl_coef"] != 0.05, f"rank {rank}"  # β restored exactly
        for a, b in zip(uninterrupted, resumed):  # the same β step for step
            assert b["kl_coef"] == pytest.approx(a["kl_coef"], rel=1e-9), (rank, a["step"])
            assert b["ref_kl"] == pytest.approx(a["ref_kl"], rel=1e-6), (rank, a["step"])


def test_ema_with_tau_zero_is_periodic_with_k_one_training_step(ema_run, two_ranks, tiny_qwen2_dir, tmp_path):
    unused = str(tmp_path / "unused")
    tau_zero = [f"{P}reference=ema", f"{P}ref_ema_decay=0.0", f"{P}ref_ema_period=1"]
    ema = two_ranks.run(ema_reference, model_dir=tiny_qwen2_dir, ckpt_dir=unused, steps=3, reference=tau_zero)
    k_two = [f"{P}reference=periodic", f"{P}ref_refresh_steps=2"]
    periodic = two_ranks.run(ema_reference, model_dir=tiny_qwen2_dir, ckpt_dir=unused, steps=3, reference=k_two)
    for rank in (0, 1):
        a, b = ema[rank], periodic[rank]
        assert [s["ref_kl"] for s in a["steps"]] == [s["ref_kl"] for s in b["steps"]], rank
        assert [s["ref_ema_updated"] for s in a["steps"]] == [s["ref_refreshed"] for s in b["steps"]] == [1, 1, 1]
        assert all(a["final_ref"][k].equal(b["final_ref"][k]) for k in b["final_ref"]), rank


@pytest.fixture(scope="module")
def sf_run(two_ranks, tiny_qwen2_dir, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("sf") / "global_step_2" / "actor")
    return two_ranks.run(schedule_free, model_dir=tiny_qwen2_dir, ckpt_dir=ckpt)


def test_schedule_free_switches_every_rank_and_resumes_exactly(sf_run):
    for rank, out in enumerate(sf_run):
        ratios = [r for pair in out["first_ratio"] for r in pair]
        assert all(abs(r - 1.0) < 1e-6 for r in ratios), f"rank {rank}: {out['first_ratio']}"
        assert out["average_changed"] and out["iterate_changed"], f"rank {rank}"
        assert out["x_matches_schedulefree_formula"] < 1e-6 and out["x_differs_from_y"], f"rank {rank}"
        assert out["y_restored_exactly"] and out["ckpt_is_y"], f"rank {rank}"
        assert out["resumed_params_equal"] and out["resumed_optimizer_equal"], f"rank {rank}"
        assert out["resumed_mode"] == "iterate" and out["step3_equal"], f"rank {rank}"
    assert sf_run[0]["hf_export_max_diff_to_x"] < 1e-6 < sf_run[0]["hf_export_max_diff_to_y"]


@pytest.fixture(scope="module")
def lora_run(two_ranks, tiny_qwen2_dir, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("lora") / "global_step_2" / "actor")
    return two_ranks.run(
        lora_periodic, model_dir=tiny_qwen2_dir, ckpt_dir=ckpt, refresh_steps=4, steps=4, save_at=2, topk=True
    )


def test_lora_periodic_refreshes_the_adapter_snapshot_on_every_rank_together(lora_run):
    r0, r1 = lora_run
    # K = 4 optimizer steps = 2 training steps: refreshes at the end of steps 2 and 4, on both ranks
    assert [s["ref_refreshed"] for s in r0["steps"]] == [s["ref_refreshed"] for s in r1["steps"]] == [0, 1, 0, 1]
    for rank, out in enumerate(lora_run):
        for s in out["steps"] + out["resumed_steps"]:
            assert s["policy_kept"], (rank, s["step"])  # the reference pass restored the policy's adapter
            assert s["support_in_ref_pass"], (rank, s["step"])  # top-k: the support of the reference's pass
            if s["ref_refreshed"]:  # each rank's snapshot shards = its adapter shards; the pass = the policy's
                assert s["snapshot_equal_adapter"] and s["logprob_gap"] < 1e-6, (rank, s)
                assert s["support_equal_policy"] and s["support_gap"] < 1e-6, (rank, s)  # top-k of the same weights
        # ... and of the snapshot's weights, not π_θ's: the same pattern as the log-probs
        support_gaps = [s["support_gap_to_policy"] for s in out["steps"]]
        assert support_gaps[0] < 1e-6 and support_gaps[1] > 1e-5 and support_gaps[3] > 1e-5, (rank, support_gaps)
        # steps 1 and 3 start at a snapshot (the initial adapter, B = 0; the refresh of step 2): π_ref = π_old there;
        # at steps 2 and 4 the policy moved on and the reference stayed
        gaps = [s["ref_old_gap"] for s in out["steps"]]
        assert gaps[0] < 1e-6 and gaps[2] < 1e-6 and gaps[1] > 1e-5 and gaps[3] > 1e-5, (rank, gaps)


def test_lora_periodic_with_the_adaptive_beta_on_every_rank(lora_run):
    from engine_scenarios import LORA_KL_HORIZON, LORA_KL_TARGET

    r0, r1 = lora_run
    for a, b in zip(r0["steps"] + r0["resumed_steps"], r1["steps"] + r1["resumed_steps"]):
        assert (a["kl_coef"], a["kl_coef_next"], a["kl_ctrl_kl"]) == (b["kl_coef"], b["kl_coef_next"], b["kl_ctrl_kl"])
    for steps in (r0["steps"], r0["resumed_steps"]):
        for s, nxt in zip(steps, steps[1:] + [None]):
            error = min(max(s["kl_ctrl_kl"] / LORA_KL_TARGET - 1, -0.2), 0.2)
            assert s["kl_coef_next"] == s["kl_coef"] * (1 + error / LORA_KL_HORIZON)
            if nxt is not None:
                assert nxt["kl_coef"] == s["kl_coef_next"]
    assert r0["resumed_steps"][0]["kl_coef"] == r0["steps"][2]["kl_coef"] != 0.05  # β moved and was resumed exactly


def test_lora_rollout_sync_reads_the_policys_adapter(lora_run):
    assert all(out["sync_reads_policy"] for out in lora_run)  # lora.merge=False: the adapter's tensors
    for out in lora_run:  # lora.merge=True: W + (α/r)·B·A of the policy's adapter (bf16), not of the snapshot's
        gaps = out["merged_sync_gaps"]
        assert gaps["layers"] == 14 and gaps["policy"] == 0.0 < gaps["snapshot"], gaps


def test_lora_periodic_resumes_exactly_on_every_rank(lora_run):
    for rank, out in enumerate(lora_run):
        assert out["loaded_schedule"] == out["saved_schedule"] and out["loaded_snapshot_equal_saved"], rank
        assert out["resumed_final_schedule"] == out["final_schedule"], rank
        assert out["resumed_snapshot_diff"] < 1e-6 and out["resumed_adapter_diff"] < 1e-6, rank
        for a, b in zip(out["steps"][2:], out["resumed_steps"]):
            assert b["ref_kl"] == pytest.approx(a["ref_kl"], rel=1e-6), (rank, a["step"])
