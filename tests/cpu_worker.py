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


def fused_worker_builder(model_dir: str, overrides: list[str] | tuple[str, ...], installs: tuple[str, ...] = ()):
    """A function that builds verl's fused `ActorRolloutRefWorker` (role `actor_rollout_ref`, rollout backend `hf`)
    in this process under the CPU platform, on `compose(model_dir, overrides)`, after `rpg.install.install(installs)`
    (what RPG_INSTALL names in a run). Skips the test when VERL_PLATFORM names another platform."""
    import pytest

    os.environ.setdefault("VERL_PLATFORM", "cpu")
    if os.environ["VERL_PLATFORM"] != "cpu":
        pytest.skip("VERL_PLATFORM is set to another platform")
    from rpg import install

    one_rank_env()
    install.install(list(installs))
    import rpg.cpu.hf_rollout  # noqa: F401  (registers rollout.name=hf, needed by the fused worker's init_model)
    from verl.workers.engine_workers import ActorRolloutRefWorker

    config = compose(model_dir, overrides)

    def build():
        worker = ActorRolloutRefWorker(config.actor_rollout_ref.copy(), role="actor_rollout_ref")
        worker.init_model()
        return worker

    return build


def token_batch(prompts: list[list[int]], responses: list[list[int]], advantages: list[float]):
    """verl's no-padding TensorDict of left-padded `prompts` and right-padded `responses` (one advantage per
    sequence, broadcast over its response), as the trainer hands it to the log-prob passes (temperature 1, no
    entropy, no loss); returns (td, response mask (bs, R) bool)."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    bs, plen, rlen = len(prompts), max(map(len, prompts)), max(map(len, responses))
    p_ids, r_ids = torch.zeros(bs, plen, dtype=torch.long), torch.zeros(bs, rlen, dtype=torch.long)
    p_mask, r_mask = torch.zeros_like(p_ids), torch.zeros_like(r_ids)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_ids[i, plen - len(p):], p_mask[i, plen - len(p):] = torch.tensor(p), 1
        r_ids[i, : len(r)], r_mask[i, : len(r)] = torch.tensor(r), 1
    mask = torch.cat([p_mask, r_mask], 1)
    adv = torch.tensor(advantages)[:, None].expand(bs, rlen) * r_mask
    td = TensorDict({"input_ids": torch.cat([p_ids, r_ids], 1), "attention_mask": mask,
                     "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "prompts": p_ids, "responses": r_ids,
                     "response_mask": r_mask, "advantages": adv}, batch_size=[bs])  # fmt: skip
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, temperature=1.0, calculate_entropy=False, compute_loss=False)
    return td, r_mask.bool()
