"""verl's actor/reference workers built in-process on CPU, on the tiny Qwen2 (shared helper).

Every in-process engine test (tests/cpu, tests/reference, tests/schedulefree, tests/ranks, tests/tools) builds verl
0.9.1's real `ActorRolloutRefWorker` (or a subclass) from verl's own `ppo_trainer` config with the same CPU base:
FSDP2 in fp32 (param, reduce and buffer dtypes), eager attention, no padding removal, no gradient checkpointing, no
torch.compile, `trainer.device=cpu`. `compose` returns that config with a test's own overrides appended (a later
override of the same key wins); `one_rank_env` sets what a single-rank process group needs.
"""

from __future__ import annotations

import os
import socket

FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
ONE_RANK_ENV = ("VERL_PLATFORM", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def base_overrides(model_dir: str) -> list[str]:
    """The CPU base of every in-process worker config (actor and reference engines), for the model in `model_dir`."""
    return [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.ref.strategy=fsdp2",
        "actor_rollout_ref.actor.use_torch_compile=False", "actor_rollout_ref.ref.use_torch_compile=False",
        f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={FP32}",
        f"+actor_rollout_ref.ref.fsdp_config.mixed_precision={FP32}",
        "trainer.device=cpu",
    ]  # fmt: skip


def compose(model_dir: str, overrides: list[str] | tuple[str, ...] = ()):
    """verl's `ppo_trainer` config: `base_overrides(model_dir)`, then `overrides`."""
    return compose_ppo_trainer(*base_overrides(model_dir), *overrides)


def compose_ppo_trainer(*overrides: str):
    """verl's own `ppo_trainer` config (verl/trainer/config) with Hydra `overrides`; nothing else added."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return hydra_compose("ppo_trainer", overrides=list(overrides))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_rank_env() -> dict[str, str | None]:
    """Set what a one-rank gloo group under the CPU platform needs (VERL_PLATFORM=cpu, WORLD_SIZE=1, RANK=0, and a
    free MASTER_PORT unless this process already has its process group), install the CPU platform, and return the
    previous values (for `restore_env`). The port is always a fresh one for a new group: a MASTER_PORT inherited from
    a parent process may be the parent's own, still bound, group."""
    import torch.distributed as dist

    saved = {k: os.environ.get(k) for k in ONE_RANK_ENV}
    os.environ.update(VERL_PLATFORM="cpu", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    if not dist.is_initialized():
        os.environ["MASTER_PORT"] = str(free_port())
    from rpg.cpu import platform as cpu_platform

    cpu_platform.install()
    return saved


def restore_env(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
