"""Test-only: every worker's top-k micro-batches written to disk (tests/ranks/test_two_ranks_e2e_on_cpu.py).

Imported by `import verl` in every process of a run through verl's own ``VERL_USE_EXTERNAL_MODULES`` (before rpg's
plugin, so rpg's hooks wrap outside this one), when ``RPG_TOPK_DUMP`` names a folder. It wraps verl 0.9.1's
``ppo_loss`` (both bindings: verl.workers.utils.losses and verl.workers.engine_workers) and, for each micro-batch of
an update that carries the top-k KL, saves what the rank saw: the packed sequences (``input_ids``, ``position_ids``,
offsets), the temperature, the support carried in the batch (`rpg.topk_hook.IDS`, `LOG_PROBS`), the rank's per-token
KL (`rpg.topk_hook.KL`) and verl's ``log_probs``, all in the nested (packed) layout of the micro-batch.

What it relies on in rpg: the three names `rpg.topk_hook.IDS`, `LOG_PROBS`, `KL` (the batch fields and model output
the hook defines); nothing of the hook's wrapping.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path

import torch

from rpg.topk_hook import IDS, KL, LOG_PROBS

ENV = "RPG_TOPK_DUMP"
MARK = "__rpg_test_topk_dump__"
_COUNT = itertools.count()


def _values(nested: torch.Tensor) -> torch.Tensor:
    return nested.values().detach().cpu().clone()


def _scalar(value):
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


def dump(model_output, data) -> None:
    """Save one micro-batch's top-k inputs and KL under $RPG_TOPK_DUMP (one file per call)."""
    from verl.utils import tensordict_utils as tu

    temperature = data["temperature"] if "temperature" in data.keys() else tu.get_non_tensor_data(
        data=data, key="temperature", default=None)
    record = {
        "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
        "pid": os.getpid(),
        "phase": os.environ.get("RPG_SMOKE_PHASE"),  # the smoke run's launch: save (step 1) or resume (step 2)
        "offsets": data["input_ids"].offsets().cpu().clone(),
        "input_ids": _values(data["input_ids"]),
        "position_ids": _values(data["position_ids"]) if "position_ids" in data.keys() else None,
        "temperature": temperature.cpu().clone() if isinstance(temperature, torch.Tensor) else temperature,
        "ids": _values(data[IDS]),
        "log_probs": _values(data[LOG_PROBS]),
        "kl": _values(model_output[KL]),
        "verl_log_probs": _values(model_output["log_probs"]),
        # verl's global batch information of the micro-batch (ppo_loss copies it into the loss's config)
        **{key: _scalar(tu.get_non_tensor_data(data=data, key=key, default=None))
           for key in ("dp_size", "batch_num_tokens", "global_batch_size")},
    }
    folder = Path(os.environ[ENV])
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(record, folder / f"{os.getpid()}-{next(_COUNT)}.pt")


def _wrap(orig):
    if getattr(orig, MARK, False):
        return orig

    @functools.wraps(orig)
    def ppo_loss(config, model_output, data, dp_group=None):
        if KL in model_output:
            dump(model_output, data)
        return orig(config, model_output, data, dp_group=dp_group)

    setattr(ppo_loss, MARK, True)
    return ppo_loss


if os.environ.get(ENV):  # verl's modules only in a run that asks for the dump
    import verl.workers.engine_workers as workers
    import verl.workers.utils.losses as losses

    losses.ppo_loss = _wrap(losses.ppo_loss)
    workers.ppo_loss = _wrap(workers.ppo_loss)
