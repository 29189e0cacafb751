"""Write a verl FSDP actor checkpoint of a Hugging Face model, as the trainer saves it (test helper, own process).

    python tests/tools/fsdp_checkpoint.py MODEL_DIR CKPT_ROOT STEP

builds verl's `ActorRolloutRefWorker` (role "actor": FSDP2, fp32, CPU platform) on MODEL_DIR in this process, saves
its checkpoint to CKPT_ROOT/global_step_STEP/actor with verl's own checkpoint manager (weight shards, optimizer,
fsdp_config.json, huggingface/ with config and tokenizer but no weights) and writes CKPT_ROOT's
latest_checkpointed_iteration.txt as the trainer does. No training step: the saved weights are MODEL_DIR's.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared cpu_worker helper


def main(model_dir: str, root: str, step: int) -> None:
    from cpu_worker import compose, one_rank_env

    one_rank_env()
    from verl.workers.engine_workers import ActorRolloutRefWorker

    config = compose(model_dir, [
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.n=1",
        "trainer.n_gpus_per_node=1",
    ])  # fmt: skip
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    worker.save_checkpoint(os.path.join(root, f"global_step_{step}", "actor"), global_step=step)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(step))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
