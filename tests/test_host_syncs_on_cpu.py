"""No device→host synchronisation per micro-batch beyond one metrics transfer (docs/losses.md#numerics, "Metrics").

On a GPU every `.item()`, `.tolist()`, `.cpu()`, `float(t)`, `bool(t)`, `nonzero()`, boolean-mask indexing or
`new_tensor(python_scalar)` in the loss path waits for the device. A `TorchFunctionMode` records those calls (the CPU
run sees the same Python-level calls as a CUDA one), for every registered loss with every option value, with a frozen
reference, and for the reference adapter's KL meter: at most ONE per loss call (the stacked metrics), none per
micro-batch in the KL meter (one when the training step ends). A few seconds.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.workers.config import ActorConfig

import rpg.losses as L
from rpg.loss_config import RPGPolicyLossConfig
from rpg.reference import adapter

pytestmark = pytest.mark.usefixtures("ref_log_prob_adapter")  # losses with a reference, in-process

SYNCING = {"item", "tolist", "cpu", "numpy", "nonzero", "argwhere", "masked_select", "new_tensor", "tensor",
           "as_tensor", "__bool__", "__float__", "__int__", "__index__", "bincount", "one_hot", "unique"}  # fmt: skip


class SyncRecorder(TorchFunctionMode):
    """Records the torch calls that synchronise a CUDA device with the host."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", repr(func))
        if name in SYNCING:
            self.calls.append(name)
        elif name == "__getitem__" and any(_bool_index(a) for a in args[1:]):
            self.calls.append("__getitem__[bool mask]")
        elif name == "to" and any(str(a) == "cpu" for a in (*args[1:], *kwargs.values())):
            self.calls.append("to(cpu)")
        return func(*args, **kwargs)


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _cases():
    choices = {"kl_placement": ["additive", "inside_clip"], "kl_clamp": [None, 10.0],
               "branch_on": ["effective_advantage", "advantage"], "kl_ratio": ["clipped", "raw"]}  # fmt: skip
    for name, spec in sorted(L.LOSSES.items()):
        if spec.family == L.ADDON:  # calls verl's base loss, whose metrics call .item() themselves
            continue
        for option in [o for o in spec.options if o in choices] or [None]:
            for value in choices[option] if option else [None]:
                yield pytest.param(name, {option: value} if option else {}, id=f"{name}-{option}={value}")


def _batch(seed=0, bs=4, T=7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, T, generator=g) * 3 - 0.05
    log_prob = (old + 0.8 * torch.randn(bs, T, generator=g)).requires_grad_(True)
    ref = old + 0.5 * torch.randn(bs, T, generator=g)
    adv = torch.randn(bs, 1, generator=g).expand(bs, T).clone()
    mask = torch.arange(T).unsqueeze(0) < torch.tensor([7, 3, 5, 1]).unsqueeze(1)
    return old, log_prob, ref, adv, mask


@pytest.mark.parametrize("name, options", list(_cases()))
def test_one_metrics_transfer_per_loss_call(name, options, monkeypatch):
    import rpg.reference.adapter

    old, log_prob, ref, adv, mask = _batch()
    monkeypatch.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: ref)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio_low=0.2,
                      clip_ratio_high=0.28, clip_ratio_c=10.0,
                      policy_loss=RPGPolicyLossConfig(loss_mode=name, kl_coef=0.05, reference="frozen", **options))
    fn = POLICY_LOSS_REGISTRY[name]
    fn(old, log_prob, adv, mask, "token-mean", cfg, None)  # warm-up (lazy imports, caches)
    with SyncRecorder() as rec:
        loss, metrics = fn(old, log_prob, adv, mask, "token-mean", cfg, torch.ones_like(old))
    assert len(rec.calls) <= 1, rec.calls
    assert metrics and all(isinstance(v, float) for v in metrics.values())
    with SyncRecorder() as rec:
        loss.backward()
    assert rec.calls == [], rec.calls


def test_the_steps_reference_kl_transfers_once_per_training_step():
    """The training step's reverse-KL sum (what the adapter adds per micro-batch, rpg/reference/step.py) stays on the
    device until `sums()`, one transfer per training step."""
    from rpg.reference.step import TrainingStep

    old, log_prob, ref, _, mask = _batch(1)
    step = TrainingStep(measure_ref_kl=True)
    with SyncRecorder() as rec:
        for _ in range(3):  # three micro-batches
            step.add_ref_kl(torch.stack(adapter.token_kl_to_reference(log_prob, old, ref, mask)))
    assert rec.calls == [], rec.calls
    with SyncRecorder() as rec:
        kl_sum, tokens, _, _ = step.sums()
    assert len(rec.calls) <= 1, rec.calls
    assert isinstance(kl_sum, float) and tokens == 3 * mask.sum().item()


def test_the_recorder_sees_syncs():
    """The recorder is not blind: the calls it must catch are caught."""
    x = torch.randn(5)
    with SyncRecorder() as rec:
        x.sum().item(), x.tolist(), float(x.sum()), bool(x.sum() > 0), x.nonzero(), x[x > 0], x.new_tensor(1.0)
    assert rec.calls == ["item", "tolist", "__float__", "__bool__", "nonzero", "__getitem__[bool mask]", "new_tensor"]
