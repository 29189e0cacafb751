"""The `ref_log_prob` adapter: the reference log-probs verl ships with a micro-batch, made visible to a registered loss.

verl 0.9.1 calls a registered policy loss with `(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
config, rollout_is_weights)`: no `ref_log_prob`, although verl's actor loss `verl.workers.utils.losses.ppo_loss`
receives the micro-batch that carries it whenever verl built its reference model (`actor.use_kl_loss=True`). There is
no extension point for this, so this module's piece of ``ppo_loss`` (`PIECES`, hooked by the table of patch points
`rpg.patches` for ``RPG_INSTALL=ref_log_prob``) pads `ref_log_prob` exactly as `ppo_loss` pads `old_log_probs` and
puts it in the call's micro-batch record (`rpg.reference.micro_batch`), where a registered loss reads it with
`current_ref_log_prob()`. The same piece adds the token KL to the reference to the current training step
(`rpg.reference.step.TrainingStep.add_ref_kl`): what the periodic reference's κ criterion reads.

The piece runs in both bindings of `ppo_loss` (`verl.workers.utils.losses` and the copy `verl.workers.engine_workers`
binds with `from ... import ppo_loss`), only when a run needs it (`rpg.install`: the run's `RPG_INSTALL` names
``ref_log_prob``); a verl run that selects no RPG reference mode or reference-based loss keeps verl's own `ppo_loss`.
verl's `distillation_ppo_loss` binds its own copy and is not covered.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from rpg.divergences import guarded_log_ratio, w_k3
from rpg.reference.micro_batch import current as current_micro_batch
from rpg.reference.step import current as current_step

__all__ = ["PIECES", "current_ref_log_prob", "ppo_loss", "token_kl_to_reference"]

Tensor = torch.Tensor


def current_ref_log_prob() -> Optional[Tensor]:
    """The reference log-probs of the micro-batch currently inside verl's ``ppo_loss``.

    Returns a detached (bs, response_len) tensor, padded exactly like the ``old_log_prob``/``log_prob`` tensors the
    registered policy loss receives (zeros on padding), or None when verl shipped no ``ref_log_prob`` (no reference
    model: ``actor.use_kl_loss=False``) or when called outside ``ppo_loss``.
    """
    record = current_micro_batch()
    return None if record is None else record.ref_log_prob


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


def ppo_loss(call: Callable, config, model_output, data, dp_group=None):
    """The piece of verl's ``ppo_loss`` (`rpg.patches`): the micro-batch's ``ref_log_prob`` into the call's record,
    and its token KL to the reference into the training step when the step measures it; then the rest of the call."""
    if "ref_log_prob" in data.keys():
        ref = data.select("ref_log_prob").to_padded_tensor()["ref_log_prob"].detach()
        current_micro_batch().ref_log_prob = ref
        step = current_step()
        if step is not None and step.measure_ref_kl:  # the periodic reference's κ reads it
            step.add_ref_kl(torch.stack(_token_kl(model_output, data, ref)))
    return call(config, model_output, data, dp_group=dp_group)


def _token_kl(model_output, data, ref: Tensor) -> tuple[Tensor, Tensor]:
    """`token_kl_to_reference` of the micro-batch in verl's layout (model outputs without padding)."""
    from verl.workers.utils.padding import no_padding_2_padding  # verl at the first call: importing this imports none

    padded = data.select("old_log_probs", "response_mask").to_padded_tensor()
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    return token_kl_to_reference(log_prob, padded["old_log_probs"], ref, padded["response_mask"])


#: the pieces of `rpg.patches` for ``RPG_INSTALL=ref_log_prob`` (attribute -> piece)
PIECES = {"ppo_loss": ppo_loss}
