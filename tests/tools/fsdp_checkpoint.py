"""Write a verl FSDP actor checkpoint of a Hugging Face model, as the trainer saves it (test helper, own process).

    python tests/tools/fsdp_checkpoint.py MODEL_DIR CKPT_ROOT STEP

builds verl's `ActorRolloutRefWorker` (role "actor": FSDP2, fp32, CPU platform) on MODEL_DIR in this process, saves
its checkpoint to CKPT_ROOT/global_step_STEP/actor with verl's own checkpoint manager (weight shards, optimizer,
fsdp_config.json, huggingface/ with config and tokenizer but no weights) and writes CKPT_ROOT's
latest_checkpointed_iteration.txt as the trainer does. No training step: the saved weights are MODEL_DIR's.
"""

import os
import socket
import sys


def main(model_dir: str, root: str, step: int) -> None:
    with socket.socket() as s:  # a free port for this process's one-rank process group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(VERL_PLATFORM="cpu", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from rpg.cpu import platform as cpu_platform

    cpu_platform.install()
    from hydra import compose, initialize_config_module
    from verl.workers.engine_workers import ActorRolloutRefWorker

    fp32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={fp32}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.n=1",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    worker.save_checkpoint(os.path.join(root, f"global_step_{step}", "actor"), global_step=step)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(step))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
