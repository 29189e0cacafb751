"""Dynamic sampling on data with no signal at all stops within its first rounds, long before its bound.

`recipe/rpg/cpu/run_rpg_reinforce_urkl.sh` (DAPO's `filter_groups` on, as in every recipe but GRPO's) on a copy of
the tiny task's training data whose ground truths are all "-1" (the tiny model answers sums of positive numbers):
accuracy is 0 in every group, so DAPO evicts every group. verl 0.9.1's own replay buffer would generate forever
(issue 25: 7 minutes without finishing step 1); the recipe's bound, `max_num_gen_batches=20` generation batches of
max_inflight_gen_batches × train_batch_size = 3 × 4 prompts, would let the step draw 240 prompts (issue 33: with a
real model, an hour on 2 cores). Rounds that keep no group stop the run after `NO_SIGNAL_ROUNDS` = 3 of them: the
step's 4 prompts, their 8 refills, then 12 (the CPU sampler refills 2 per evicted group, at most 12 at once), 24
prompts drawn. The run logs a line per round with the fraction kept, then stops with the message naming the likely
causes and the opt-out, exit code non-zero, before any training step is logged. One rank, no validation.
"""

import json

import pandas as pd
import pytest
from cpu_trainer import start_cpu_recipe

from rpg.dynamic_sampling import BOUND_KEY, NO_SIGNAL_KEY

pytestmark = [pytest.mark.slow, pytest.mark.trainer]  # a trainer start-up: its own job (scripts/test.sh)


def test_a_run_on_unmatchable_data_stops_within_its_first_rounds(tiny_dir, tmp_path):
    data = pd.read_parquet(tiny_dir / "train.parquet")
    data["reward_model"] = [{**row, "ground_truth": "-1"} for row in data["reward_model"]]
    train = tmp_path / "unmatchable.parquet"
    data.to_parquet(train)
    overrides = ["trainer.val_before_train=False", "data.val_max_samples=8"]  # the recipe's bound: 20 batches
    rc, text = start_cpu_recipe(tmp_path, "unmatchable", overrides, timeout_s=600, TRAIN_FILE=str(train),
                                CPU_STEPS="2", CPU_TEST_FREQ="2", CPU_BATCH="4", CPU_N="4", CPU_SEED="0")  # fmt: skip
    tail = "\n".join(text.splitlines()[-40:])
    assert rc not in (0, "timeout"), f"the run did not stop with an error (rc {rc}):\n{tail}"
    rounds = [line.split("[rpg.dynamic_sampling] ", 1)[1] for line in text.splitlines()
              if "[rpg.dynamic_sampling] step 1 round" in line]  # fmt: skip
    # 24 prompts drawn, every group filtered: the step's 4 (round 1), its 8 refills (round 2), 12 more (round 3)
    assert [r.split(";")[0] for r in rounds] == ["step 1 round 1: 0 of 4 groups kept (0%)",
                                                 "step 1 round 2: 0 of 8 groups kept (0%)",
                                                 "step 1 round 3: 0 of 12 groups kept (0%)"], (rounds, tail)
    assert rounds[-1].endswith(f"24 prompts drawn of at most 240 ({BOUND_KEY}=20)"), rounds
    assert ("[rpg] error: dynamic sampling stopped at training step 1: no signal at all, the first 3 rounds "
            "(24 finished groups, 24 prompts drawn) kept no group") in text, tail
    assert "every response got the same acc (acc = 0 in 24)" in text, tail
    for cause in ("chat template", "answer format", "response length", f"+{NO_SIGNAL_KEY}=0"):
        assert cause in text, (cause, tail)
    log = tmp_path / "unmatchable.jsonl"
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()] if log.is_file() else []
    assert steps == [], f"no training step can have been logged, got {steps}"
