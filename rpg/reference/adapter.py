"""The `ref_log_prob` adapter: the reference log-probs verl ships with a micro-batch, made visible to a registered loss.

verl 0.9.1 calls a registered policy loss with `(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
config, rollout_is_weights)`: no `ref_log_prob`, although verl's actor loss `verl.workers.utils.losses.ppo_loss`
receives the micro-batch that carries it whenever verl built its reference model (`actor.use_kl_loss=True`). There is
no extension point for this, so `install()` wraps that one function: the wrapper pads `ref_log_prob` exactly as
`ppo_loss` pads `old_log_probs` and publishes it in a `contextvars.ContextVar` for the duration of the call, where a
registered loss reads it with `current_ref_log_prob()`. The same wrapper adds the token KL to the reference to the
current training step (`rpg.reference.step.TrainingStep.add_ref_kl`): what the periodic reference's κ criterion reads.

`install()` replaces `ppo_loss` in `verl.workers.utils.losses` and the copy `verl.workers.engine_workers` binds with
`from ... import ppo_loss`, after checking the verl version and `ppo_loss`'s signature (`rpg.compat`). It runs only
when a run needs it (`rpg.install`: the run's `RPG_INSTALL` names ``ref_log_prob``); a verl run that selects
no RPG reference mode or reference-based loss keeps verl's own `ppo_loss`. verl's `distillation_ppo_loss` binds its
own copy and is not covered.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from typing import Callable, Optional

import torch

from rpg.compat import SUPPORTED_VERL, require_signature, require_version
from rpg.divergences import guarded_log_ratio, w_k3
from rpg.reference.step import current as current_step

__all__ = ["check", "current_ref_log_prob", "install", "installed", "token_kl_to_reference"]

Tensor = torch.Tensor

LOSSES_MODULE = "verl.workers.utils.losses"
WORKERS_MODULE = "verl.workers.engine_workers"
PPO_LOSS_PARAMS = ("config", "model_output", "data", "dp_group")
WHAT = "rpg's ref_log_prob adapter around verl's ppo_loss (rpg/reference/adapter.py)"
MARK = "__rpg_reference_wrapper__"

_CURRENT_REF_LOG_PROB: contextvars.ContextVar[Optional[Tensor]] = contextvars.ContextVar(
    "rpg_current_ref_log_prob", default=None
)


def current_ref_log_prob() -> Optional[Tensor]:
    """The reference log-probs of the micro-batch currently inside verl's ``ppo_loss``.

    Returns a detached (bs, response_len) tensor, padded exactly like the ``old_log_prob``/``log_prob`` tensors the
    registered policy loss receives (zeros on padding), or None when verl shipped no ``ref_log_prob`` (no reference
    model: ``actor.use_kl_loss=False``) or when called outside ``ppo_loss``.
    """
    return _CURRENT_REF_LOG_PROB.get()


def token_kl_to_reference(
    log_prob: Tensor, old_log_prob: Tensor, ref_log_prob: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """(Σ KL̂, #tokens) of the importance-weighted k3 estimate of KL(π_θ‖π_ref) over the masked tokens, as float64
    0-d tensors on the inputs' device (no host synchronisation).

    Per token (paper §2.2, the corrected GRPO estimator): ``w·k3(π_ref/π_θ) = w·k3(ρ/w)`` (`rpg.divergences.w_k3`)
    with ``w = π_θ/π_old`` and ``ρ = π_ref/π_old``; for tokens sampled from π_old its expectation is
    KL(π_θ(·|h)‖π_ref(·|h)), and it is ≥ 0. All inputs (bs, response_len); the result is detached (a monitoring
    statistic, no gradient). Log-ratios go through the losses' guard (`rpg.divergences.guarded_log_ratio`: 0 on
    padding, ±LOG_RATIO_GUARD), so garbage on padding or a wild ratio cannot produce inf/NaN.
    """
    with torch.no_grad():
        m = mask.to(torch.bool)
        lp = log_prob.detach().double()
        log_w = guarded_log_ratio(lp, old_log_prob.detach().double(), m)
        log_rho = guarded_log_ratio(ref_log_prob.detach().double(), old_log_prob.detach().double(), m)
        kl = w_k3(log_w, torch.exp(log_w), log_rho, torch.exp(log_rho))
        return torch.where(m, kl, 0.0).sum(), m.sum(dtype=torch.float64)


_WRAPPERS: dict[int, tuple[Callable, Callable]] = {}  # id(original) -> (original, wrapper)


def _wrap_ppo_loss(orig: Callable) -> Callable:
    """The (unique, cached) adapter wrapper of verl's ``ppo_loss``."""
    cached = _WRAPPERS.get(id(orig))
    if cached is not None and cached[0] is orig:
        return cached[1]

    @functools.wraps(orig)
    def ppo_loss(config, model_output, data, dp_group=None):
        ref = None
        if "ref_log_prob" in data.keys():
            ref = data.select("ref_log_prob").to_padded_tensor()["ref_log_prob"].detach()
        step = current_step()
        if ref is not None and step is not None and step.measure_ref_kl:  # the periodic reference's κ reads it
            from verl.workers.utils.padding import no_padding_2_padding

            padded = data.select("old_log_probs", "response_mask").to_padded_tensor()
            log_prob = no_padding_2_padding(model_output["log_probs"], data)
            step.add_ref_kl(torch.stack(token_kl_to_reference(log_prob, padded["old_log_probs"], ref,
                                                              padded["response_mask"])))  # fmt: skip
        token = _CURRENT_REF_LOG_PROB.set(ref)
        try:
            return orig(config, model_output, data, dp_group=dp_group)
        finally:
            _CURRENT_REF_LOG_PROB.reset(token)

    setattr(ppo_loss, MARK, True)
    _WRAPPERS[id(orig)] = (orig, ppo_loss)
    return ppo_loss


def _is_adapter(fn: Callable) -> bool:
    return getattr(fn, MARK, False) is True


def installed() -> bool:
    """True when both bindings of verl's ``ppo_loss`` (the module's and engine_workers') are the adapter."""
    modules = [sys.modules.get(LOSSES_MODULE), sys.modules.get(WORKERS_MODULE)]
    return all(m is not None and _is_adapter(m.ppo_loss) for m in modules)


def _unwrapped() -> list:
    """The verl modules whose ``ppo_loss`` binding is not the adapter yet (imports verl's worker modules)."""
    import verl.workers.engine_workers as workers
    import verl.workers.utils.losses as losses

    return [m for m in (losses, workers) if not _is_adapter(m.ppo_loss)]


def check() -> None:
    """Raise RuntimeError if `install` would wrap a ``ppo_loss`` of an unsupported verl version or signature."""
    todo = _unwrapped()
    if todo:
        require_version("verl", SUPPORTED_VERL, WHAT)
    for module in todo:
        require_signature(module.ppo_loss, PPO_LOSS_PARAMS, WHAT)


def install() -> None:
    """Wrap verl's ``ppo_loss`` in both modules (idempotent), after `check`: nothing is patched if it fails."""
    check()
    for module in _unwrapped():
        module.ppo_loss = _wrap_ppo_loss(module.ppo_loss)
