"""Sequence-level KL credit (`kl_credit=sequence`): prefix ratios and future-KL sums over a response's model tokens.

The per-token KL surrogates give the gradient of the per-token objective `Σ_t E_{h_t~π_old}[KL_t(h_t)]`; the
sequence-level divergence between whole responses also moves the history distribution (Tang & Munos, arXiv
2506.09477; docs/losses.md#kl-credit). With `P_t = Π_{s<t} w_s`, `R_t = Π_{s<t} ρ_s` over model tokens and
`k̂_t` the per-token estimate of `KL_t(h_t)` (`Divergence.estimate`):

    reverse rows (D(π_θ‖π_ref)):  history weight P_t, future credit G_t = Σ_{t'>t} P_{t'}·k̂_{t'}
    forward rows (D(π_ref‖π_θ)):  history weight R_t, no future credit (the history follows π_ref)

Everything here is detached data, computed in float64 and returned in the dtype of the inputs: log-prefix sums are
limited to ±LOG_RATIO_GUARD and β·G saturates at finfo(dtype).max·e^−EXP_HEADROOM (finite values, exact below those
bounds; docs/losses.md#kl-credit lists them as approximations). Tokens outside `mask` (padding, observation spans
of multi-turn responses) contribute nothing and are skipped by the products and sums (docs/losses.md#multi-turn).
Depends only on `rpg.divergences`.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from rpg.divergences import EXP_HEADROOM, LOG_RATIO_GUARD, Divergence, Scalar

Tensor = torch.Tensor
KL_CREDIT = ("token", "sequence")


class SequenceCredit(NamedTuple):
    """Detached (bs, T) tensors of the sequence-level credit (docs/losses.md#kl-credit)."""

    history: Tensor  # P_t (reverse rows) or R_t (forward rows); 1 at the first model token and on masked tokens
    future: Optional[Tensor]  # β·G_t (reverse rows), None for forward rows; 0 on masked tokens


def exclusive_prefix_sum(x: Tensor) -> Tensor:
    """Σ_{s<t} x_s along the last dim (0 at t = 0)."""
    return torch.cumsum(x, -1) - x


def exclusive_suffix_sum(x: Tensor) -> Tensor:
    """Σ_{s>t} x_s along the last dim (0 at the last position)."""
    return torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1]) - x


def _saturate(x: Tensor, dtype: torch.dtype) -> Tensor:
    bound = torch.finfo(dtype).max * math.exp(-EXP_HEADROOM)
    return x.clamp(-bound, bound).to(dtype)


def sequence_credit(
    div: Divergence, log_w: Tensor, log_rho: Scalar, mask: Tensor, beta: float
) -> SequenceCredit:
    """The history weights and (reverse rows) the future credit β·G_t of every token.

    `log_w`, `log_rho`: guarded log-ratios (0 on masked tokens, `rpg.divergences.guarded_log_ratio`), `log_rho` may be
    the Python 0.0 of the iterative reference; `mask` bool (bs, T): the model tokens."""
    with torch.no_grad():
        dtype = log_w.dtype
        lw = torch.where(mask, log_w.detach().double(), 0.0)
        if div.reverse:
            log_hist = exclusive_prefix_sum(lw).clamp_(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)
            hist = torch.exp(log_hist)
            if isinstance(log_rho, float):
                lr, rho = log_rho, math.exp(log_rho)
            else:
                lr = torch.where(mask, log_rho.detach().double(), 0.0)
                rho = torch.exp(lr)
            k_hat = torch.where(mask, div.estimate(lw, torch.exp(lw), lr, rho), 0.0)
            future = exclusive_suffix_sum(hist * k_hat) * beta
            return SequenceCredit(hist.to(dtype), _saturate(future, dtype))
        if isinstance(log_rho, float):  # iterative (or constant) reference: R_t = ρ^(#model tokens before t)
            if log_rho == 0.0:
                return SequenceCredit(torch.ones_like(log_w, dtype=dtype), None)
            lr = torch.where(mask, torch.full_like(lw, log_rho), 0.0)
        else:
            lr = torch.where(mask, log_rho.detach().double(), 0.0)
        log_hist = exclusive_prefix_sum(lr).clamp_(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)
        return SequenceCredit(torch.exp(log_hist).to(dtype), None)


def credited_kl_weight(credit: SequenceCredit, kl_c: Tensor) -> Tensor:
    """The REINFORCE family's KL part of the weight under sequence credit: `P_t·C_t − β·G_t` (reverse rows) or
    `R_t·C_t` (forward rows), from the token-credit `kl_c` = β·C_KL (detached; a new tensor)."""
    with torch.no_grad():
        dtype = kl_c.dtype
        out = credit.history.double() * kl_c.double()
        if credit.future is not None:
            out = out - credit.future.double()
        return _saturate(out, dtype)


def credited_kl_adv(kl_c: Tensor, log_w: Tensor, mask: Tensor) -> Tensor:
    """C/w of the credited weight `kl_c` (`credited_kl_weight`), 0 on masked tokens: formed in float64 from log w
    and saturated in kl_c's dtype (w ≈ e^-60 at the guard would overflow a float32 division)."""
    with torch.no_grad():
        ratio = kl_c.double() * torch.exp(-log_w.double())
        return torch.where(mask, _saturate(ratio, kl_c.dtype), 0.0)

