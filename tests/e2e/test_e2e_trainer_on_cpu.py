"""End to end on CPU: verl 0.9.1's unmodified trainer with the RPG plugin, through the project's own launcher, run
locally and submitted to a real Ray cluster.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` (common.sh -> the CPU profile -> `python -m rpg.launch` -> verl's
`run_ppo`; the "hf" rollout, DAPO group filtering) runs RPG-REINFORCE-URKL with the `rpg` advantage estimator and
schedule-free AdamW (`OPTIM=schedulefree`) on the tiny model: 2 steps of four prompts × four samples (so DAPO evicts
and refills groups), two mini-batches per step, validation before training and after step 2 (32 held-out prompts, 2
samples each), a checkpoint at step 2 with the HF export. Two
trainer processes, started at once for the tests of this module:

* ``first``   the run above, on the Ray the launcher starts itself;
* ``second``  the same run with the same seed (``CPU_SEED=0``), in its own folder, submitted with ``RAY_ADDRESS`` to
  a private Ray head (local_ray_head.py: 127.0.0.1, its own temp dir and ports, 16 CPUs and 1 fake GPU as
  `ray start --head --num-cpus=16 --num-gpus=1` would give), exactly as a user's cluster gets it: the launcher's
  defaults (no PYTHON: the job runs `python3 -m rpg.launch` on the cluster), Ray's job-submission SDK
  (rpg/preflight/ray_submit.py): the repo uploaded as the job's working directory, the `rpg` package as a py_module,
  the CPU profile's environment in the runtime env, verl's trainer joining the existing cluster. The head uses Ray's
  token authentication with its own token; the submitting shell has RAY_AUTH_MODE=token and the token's path, as a
  user's shell needs for such a cluster (recipe/rpg/README.md, "Several nodes").

Checks:

* the plugin runs inside the Ray actor workers: RPG metrics (`actor/rpg/...`) and `actor/pg_loss` are logged and
  finite at every step (verl's file logger, one JSON line per step); with two mini-batches per step the second
  update is off-policy, so the KL to the iterative reference π_old is non-zero (`actor/rpg/kl` > 0);
* validation ran (`val-core/...` accuracy in [0, 1]) and the rollout used the actor's current weights
  (`training/rollout_probs_diff_mean` ~ 0: the rollout and actor log-probs of the sampled tokens agree);
* schedule-free (rpg/schedule_free.py) with the iterative KL: the rollout replica gets the iterate y after every
  update and the average x around validation (weight pushes at steps 0, 1, 2, 2, 2); the checkpoint holds y with the
  optimizer in train mode after k = 4 optimizer steps, and its HF export is the average x, bit for bit, x ≠ y (two
  ranks, resume and the periodic reference: tests/ranks/test_two_ranks_e2e_on_cpu.py's smoke run);
* the checkpoint was written at step 2 (resuming from a checkpoint through this trainer is proven on two ranks,
  tests/ranks/test_two_ranks_e2e_on_cpu.py, and with the vLLM rollout, tests/vllm_cpu/test_vllm_e2e_on_cpu.py);
* the cluster job: the script prints the submission id and the commands to follow it, follows the job to the end
  and exits 0; `ray job status` says SUCCEEDED; the job's console lines (one per step) reach the submitting terminal;
* same seed, same numbers, locally or on a cluster: every logged number of ``first`` and ``second`` is identical,
  except wall-clock timings, throughput and memory: validation accuracy, rewards, losses, gradient norms, the RPG KL
  and the DAPO counts. What makes this hold is documented in rpg/cpu/hf_rollout.py (per-request seeds) and
  rpg/cpu/sampler.py (batches independent of completion timing);
* the demo's numbers have not moved (tests/e2e/demo_guard.py): step 0's validation accuracy and the first two steps'
  reward, loss and KL equal the values recorded for this machine's tiny-model build (skipped, saying so, for a build
  with no record);
* a job that fails is reported as failed: a third trainer, submitted to the cluster on data with no signal at all
  (every ground truth unreachable), stops within dynamic sampling's first 3 rounds with the message naming the likely
  causes, before any step; the script exits non-zero, the job is FAILED in `ray job status`, and the message is in
  the job's logs (streamed by the script and kept by Ray). The launcher's own refusals (a bad override, before Ray)
  are tested without a trainer (tests/recipes/test_dry_run_on_cpu.py).

Cost: the head (~10-40 s), two trainer start-ups at the same time, then the failing one: about 5 minutes on 2 cores
(artifacts/tiny is built once per session if missing).
"""

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import torch
import demo_guard
from cpu_trainer import assert_hf_export_is_x, check_steps, finite, run_cpu_recipe, start_cpu_recipe, training_steps

from rpg.dynamic_sampling import BOUND_KEY, NO_SIGNAL_KEY

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)

# wall-clock and machine-state metrics, the only ones allowed to differ between two runs
TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
SIZES = dict(CPU_BATCH="4", CPU_MINI_BATCH="2", CPU_N="4", CPU_TEST_FREQ="2", CPU_SEED="0")
VALIDATION = ["data.val_max_samples=32", "actor_rollout_ref.rollout.val_kwargs.n=2"]
BIN = Path(sys.executable).parent  # the project's environment, activated as a user's shell would have it
RAY = str(BIN / "ray")


@pytest.fixture(scope="module")
def head(tiny_dir, tmp_path_factory):
    from local_ray_head import LocalRayHead

    h = LocalRayHead(num_cpus=16, num_gpus=1)
    logs = tmp_path_factory.mktemp("ray_head_logs")  # Ray's session logs, kept for a failure's diagnosis
    try:
        yield h
    finally:
        survivors = h.stop(keep_logs=logs)
    assert not survivors, f"processes of the test's Ray head survived SIGKILL: {survivors}"


def job_env(head) -> dict[str, str | None]:
    """A user's shell that submits to `head`: RAY_ADDRESS, Ray's token settings, the environment's bin on PATH, and
    no PYTHON (the job runs the launcher's default `python3` on the cluster)."""
    return {"RAY_ADDRESS": head.address, "PYTHON": None, "PATH": f"{BIN}:{os.environ['PATH']}", **head.client_env}


def submission(text: str, head) -> str:
    """The job id the script printed, with the commands to follow the job."""
    found = re.search(r"\[rpg\] Ray job submission id: (\S+) \(cluster (\S+)\)", text)
    assert found, f"no submission id printed:\n{text[-3000:]}"
    assert found.group(2) == head.address
    assert f"ray job logs --address {head.address} --follow {found.group(1)}" in text
    return found.group(1)


def ray_job(head, *args: str) -> str:
    """`ray job <args> --address <head>` as a client of the test's head; stdout + stderr."""
    env = {k: v for k, v in {**os.environ, **head.client_env}.items() if v is not None}
    out = subprocess.run([RAY, "job", *args, "--address", head.address], capture_output=True, text=True, env=env,
                         timeout=60)  # fmt: skip
    return out.stdout + out.stderr


def run_trainer(tmp: Path, name: str, **env: str | None) -> tuple[list[dict], str]:
    """2 steps of 2 mini-batches of 2 prompts × 4 responses, validation before training and every 2 steps, a
    checkpoint every 2 steps; returns the metric records and the console text."""
    overrides = [*VALIDATION, "trainer.save_freq=2", "trainer.val_before_train=True", "trainer.resume_mode=disable",
                 "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]
    return run_cpu_recipe(tmp, name, overrides, CPU_STEPS="2", OPTIM="schedulefree",
                          RAY_DEDUP_LOGS="0",  # Ray would fold the replica's repeated weight-push lines
                          **SIZES, **env)  # fmt: skip


@pytest.fixture(scope="module")
def runs(head, tmp_path_factory) -> dict:
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("first", "second")}
    with ThreadPoolExecutor(2) as pool:  # two independent trainers at once: the critical path halves
        local = pool.submit(run_trainer, dirs["first"], "first")
        job = pool.submit(run_trainer, dirs["second"], "second", **job_env(head))
        (first, first_text), (second, second_text) = local.result(), job.result()
    return {"first": first, "first_text": first_text, "second": second, "second_text": second_text,
            "ckpt": dirs["first"] / "ckpts"}  # fmt: skip


def check_training_steps(records: list[dict], steps: list[int]) -> None:
    train = training_steps(records)
    assert sorted(train) == steps, f"logged training steps {sorted(train)}, expected {steps}"
    for step, data in train.items():
        rpg = {k: v for k, v in data.items() if k.startswith("actor/rpg")}
        assert rpg, f"step {step}: no actor/rpg/* metrics; actor keys: {sorted(k for k in data if 'actor' in k)}"
        bad = {k: v for k, v in {**rpg, "actor/pg_loss": data["actor/pg_loss"]}.items() if not finite(v)}
        assert not bad, f"step {step}: non-finite metrics {bad}"
        assert "timing_s/ref" not in data  # iterative reference: no reference model forward
        # two optimizer steps per training step: the second is off-policy, so the KL to π_old is active
        assert data["actor/rpg/kl"] > 0, "the RPG KL term was never active"
        assert abs(data["training/rollout_probs_diff_mean"]) < 1e-3, "rollout and actor log-probs disagree"


def by_step(records: list[dict]) -> dict[int, dict]:
    """step -> every logged number but the wall-clock ones."""
    steps: dict[int, dict] = {}
    for r in records:
        steps.setdefault(r["step"], {}).update(
            {k: v for k, v in r["data"].items() if not k.startswith(TIMING_PREFIXES)})
    return steps


def test_train_validate_checkpoint(runs):
    first = runs["first"]
    check_training_steps(first, [1, 2])
    val = {k: v for r in first for k, v in r["data"].items() if k.startswith("val-core/") and "acc" in k}
    assert val and all(finite(v) and 0.0 <= v <= 1.0 for v in val.values()), f"validation metrics: {val}"
    assert (runs["ckpt"] / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (runs["ckpt"] / "global_step_2" / "actor").is_dir()


def test_the_demos_numbers_have_not_moved(runs, tiny_dir):
    """The guard of the README's demo numbers (tests/e2e/demo_guard.py): this run's step-0 validation accuracy and
    its first two steps' reward, loss and KL equal the values recorded for this tiny model's build."""
    build, got = demo_guard.build_id(tiny_dir), demo_guard.first_steps(runs["first"])
    if demo_guard.wants_recording():
        demo_guard.record(build, got)
    expected = demo_guard.recorded().get(build)
    if expected is None:
        pytest.skip(f"no record of the demo's numbers for this tiny model build ({build}: another processor builds "
                    f"another model, docs/cpu.md#demo-results); to record: {demo_guard.RECORD_ENV}=1, got {got}")
    problems = demo_guard.moved(expected, got)
    assert not problems, demo_guard.MOVED + ":\n" + "\n".join(problems)


def test_schedule_free_pushes_y_and_x_and_exports_x(runs):
    pushes = re.findall(r"HFRolloutServer\[(\d+)\] weights <- step (\d+)", runs["first_text"])
    # y after each update; x before the validation at step 2, y after it
    assert pushes == [("0", s) for s in ("0", "1", "2", "2", "2")], pushes
    ckpt = runs["ckpt"] / "global_step_2" / "actor"
    group = torch.load(ckpt / "optim_world_size_1_rank_0.pt", weights_only=False)["param_groups"][0]
    assert group["train_mode"] is True and group["k"] == 4, (group["train_mode"], group["k"])  # 2 steps × 2 updates
    assert_hf_export_is_x(ckpt, world_size=1)  # x ≠ y: the export is the average, not the iterate


def test_the_job_on_the_cluster_succeeds(runs, head):
    text = runs["second_text"]
    assert "succeeded" in ray_job(head, "status", submission(text, head)).lower()
    check_steps(runs["second"], text, [1, 2])  # the job's console lines reach the submitting terminal


def test_same_seed_same_numbers_locally_and_on_a_cluster(runs):
    first, second = by_step(runs["first"]), by_step(runs["second"])
    assert sorted(first) == [0, 1, 2]
    assert any(k.startswith("val-core/") for k in first[0]) and "actor/rpg/kl" in first[2]
    for step in first:
        diff = {k: (v, second[step].get(k)) for k, v in first[step].items() if second[step].get(k) != v}
        assert not diff and first[step].keys() == second[step].keys(), f"step {step} differs: {diff}"


def test_a_job_without_signal_stops_early_and_is_reported_as_failed(head, tiny_dir, tmp_path):
    """Dynamic sampling on data with no signal at all stops within its first rounds, long before its bound, and the
    cluster reports the job as failed.

    The tiny task's training data with every ground truth "-1" (the tiny model answers sums of positive numbers):
    accuracy is 0 in every group, so DAPO's `filter_groups` evicts every group. verl 0.9.1's own replay buffer would
    generate forever (issue 25: 7 minutes without finishing step 1); the recipe's bound, `max_num_gen_batches=20`
    generation batches of max_inflight_gen_batches × train_batch_size = 3 × 4 prompts, would let the step draw 240
    prompts (issue 33: with a real model, an hour on 2 cores). Rounds that keep no group stop the run after
    `NO_SIGNAL_ROUNDS` = 3 of them: the step's 4 prompts, their 8 refills, then 12 (the CPU sampler refills 2 per
    evicted group, at most 12 at once), 24 prompts drawn. The run logs a line per round with the fraction kept, then
    stops with the message naming the likely causes and the opt-out, before any training step is logged; the script
    exits non-zero, `ray job status` says FAILED, and the message is in the job's logs (streamed by the script and
    kept by Ray)."""
    data = pd.read_parquet(tiny_dir / "train.parquet")
    data["reward_model"] = [{**row, "ground_truth": "-1"} for row in data["reward_model"]]
    train = tmp_path / "unmatchable.parquet"
    data.to_parquet(train)
    overrides = ["trainer.val_before_train=False", "data.val_max_samples=8"]  # the recipe's bound: 20 batches
    rc, text = start_cpu_recipe(tmp_path, "unmatchable", overrides, TRAIN_FILE=str(train),
                                CPU_STEPS="2", CPU_RESPONSE_LEN="16",  # no answer can match: short responses suffice
                                **SIZES, **job_env(head))  # fmt: skip
    tail = "\n".join(text.splitlines()[-40:])
    assert rc not in (0, "timeout"), f"the run did not stop with an error (rc {rc}):\n{tail}"
    rounds = [line.split("[rpg.dynamic_sampling] ", 1)[1] for line in text.splitlines()
              if "[rpg.dynamic_sampling] step 1 round" in line]  # fmt: skip
    # 24 prompts drawn, every group filtered: the step's 4 (round 1), its 8 refills (round 2), 12 more (round 3)
    assert [r.split(";")[0] for r in rounds] == ["step 1 round 1: 0 of 4 groups kept (0%)",
                                                 "step 1 round 2: 0 of 8 groups kept (0%)",
                                                 "step 1 round 3: 0 of 12 groups kept (0%)"], (rounds, tail)
    assert rounds[-1].endswith(f"24 prompts drawn of at most 240 ({BOUND_KEY}=20)"), rounds
    error = ("[rpg] error: dynamic sampling stopped at training step 1: no signal at all, the first 3 rounds "
             "(24 finished groups, 24 prompts drawn) kept no group")  # fmt: skip
    assert error in text, tail
    assert "every response got the same acc (acc = 0 in 24)" in text, tail
    for cause in ("chat template", "answer format", "response length", f"+{NO_SIGNAL_KEY}=0"):
        assert cause in text, (cause, tail)
    log = tmp_path / "unmatchable.jsonl"
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()] if log.is_file() else []
    assert steps == [], f"no training step can have been logged, got {steps}"
    job_id = submission(text, head)
    status = ray_job(head, "status", job_id)
    assert "failed" in status.lower(), status
    assert error in ray_job(head, "logs", job_id), "the error is not in the job's logs, as Ray keeps them"
