"""The four KL divergences of RPG, defined once, and the numerics every formula shares.

Every formula of the paper that depends on the divergence is a per-token function of the importance ratio
`w = π_θ/π_old` (`log_w = log π_θ − log π_old`) and of the reference ratio `ρ = π_ref/π_old` (`log_ρ`; ρ ≡ 1 under
the iterative reference π_ref = π_old, paper §5). Each row of the table gives them in one form,

    T(w, ρ)   = ρ·p(log w, log ρ) + w·q(log w, log ρ)     the paper's Table 1/4 loss (generalised to ρ ≠ 1)
    C_KL/β    = a·ρ + w·b(log w, log ρ)                  the KL part of the REINFORCE weight (Table 2, App. F)

from which every quantity the losses use is derived (docs/losses.md#rho-weighting):

* `surrogate` D̂ = T (+ ρ for URKL, so that it is the non-negative w·k3(ρ/w)) — the fully differentiable regulariser
  (Tables 1, 4), minimised with weight β; its gradient is `−C_KL/β · ∇log π_θ` per sample
  (docs/losses.md#fully-differentiable-surrogates).
* `kl_component` C_KL/β — used inside a stop-gradient by the REINFORCE family (Algorithm 2; Props. F.1, F.3–F.5).
* `table_adv` β·T/w — the KL part of the θ-dependent Â = A − β·T/w of the literal Algorithm 1 (`inside_clip`),
  computed as `β·(ρ/w)·p + β·q`: no division by w, so neither the value nor autograd's derivative forms w² or the
  difference of two numbers of size ρ (docs/losses.md#numerics).
* `kl_adv` β·C_KL(w_k)/w — the KL part of the REINFORCE effective advantage A' = A + C/w (C at w_k = w̄ or w),
  computed as `a·β·(ρ/w) + β·(w_k/w)·b`.
* `estimate` — a non-negative, unbiased per-token estimate of the divergence on π_old samples, for logging:
  `ρ·k3(w/ρ)` (`rho_k3`, forward divergences) or `w·k3(ρ/w)` (`w_k3`, reverse ones; k3 ≡ UKL, App. D, Remark 3.5).

With ρ ≡ 1:

| div  | T (Tables 1/4)           | C_KL/β (App. F)    | objective                      |
|------|--------------------------|--------------------|--------------------------------|
| fkl  | −log w                   | +1                 | E[R] − β·KL(π_old‖π_θ)   (E.1) |
| ufkl | w − log w − 1  (= k3(w)) | 1 − w              | E[R] − β·UKL(π_old‖π_θ)  (3.1) |
| rkl  | w·log w                  | −w·(log w + 1)     | E[R] − β·KL(π_θ‖π_old)   (E.2) |
| urkl | w·log w − w              | −w·log w           | E[R] − β·UKL(π_θ‖π_old)  (3.3) |

For normalised policies UKL = KL, so UFKL/FKL (and URKL/RKL) are the same objective; their estimators differ by the
zero-mean control variate ±β·w (docs/losses.md#control-variates), which the tests check exactly.

Numerics. `guarded_log_ratio` masks padding to 0 and limits every log-ratio to ±LOG_RATIO_GUARD (the one guard of the
package, also used by the reference's KL meter); every function here expects log-ratios within it. Within it, w, ρ,
their inverses and their products with log-ratios are finite in float32; only ρ/w (and w/ρ) can reach e^120.
`scaled_ratio` computes β·ρ/w in the working dtype with its exponent limited so that the value saturates at
finfo(dtype).max·e^−EXP_HEADROOM: every value and gradient is finite, and exact wherever it is below that bound (the
limit is skipped where the exponent cannot reach it, e.g. for ρ ≡ 1 or in float64).

All functions are elementwise on tensors of any shape (typically (batch, response_len)); `log_rho`/`rho` may be the
Python scalars 0.0/1.0 (iterative reference) to skip work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

Tensor = torch.Tensor
Scalar = Union[Tensor, float]
LogFn = Callable[[Tensor, Scalar], Scalar]  # f(log_w, log_rho)

LOG_RATIO_GUARD = 60.0  # |log w|, |log ρ| limit: exp(60) ≈ 1.1e26 and its products with log-ratios are finite in fp32
EXP_HEADROOM = 20.0  # β·ρ/w saturates at finfo(dtype).max·e^−20 (≈ 7e29 in fp32), leaving room for sums and products


def guarded_log_ratio(log_p: Tensor, log_q: Tensor, mask: Tensor) -> Tensor:
    """log(p/q) on valid tokens, 0 on padding (so NaN/inf garbage never reaches a gradient), limited to
    ±LOG_RATIO_GUARD. Shapes: (bs, T) each; `mask` bool."""
    return torch.where(mask, log_p - log_q, 0.0).clamp_(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)


def _saturation(dtype: torch.dtype) -> float:
    finfo = torch.finfo(dtype)
    return finfo.max * math.exp(-min(EXP_HEADROOM, math.log(finfo.max) / 4))


def scaled_ratio(log_ratio: Tensor, beta: float, max_log_ratio: float = 2 * LOG_RATIO_GUARD) -> Tensor:
    """β·exp(log_ratio) (β ≥ 0; e.g. β·ρ/w with log_ratio = log ρ − log w, up to e^120 within the guard) in the dtype of
    `log_ratio`, saturated at finfo(dtype).max·e^−EXP_HEADROOM: exact below that bound, finite (with zero gradient)
    above it. `max_log_ratio` bounds `log_ratio` (2·LOG_RATIO_GUARD for log ρ − log w, LOG_RATIO_GUARD for −log w):
    where β·e^max_log_ratio is below the bound (ρ ≡ 1, float64) nothing can saturate and no limit is applied."""
    if not beta >= 0.0:
        raise ValueError(f"the KL coefficient β must be ≥ 0, got {beta!r}")
    if beta == 0.0:
        return torch.zeros_like(log_ratio)
    finfo = torch.finfo(log_ratio.dtype)
    log_beta = math.log(beta)
    limit = math.log(_saturation(log_ratio.dtype)) - log_beta  # β·e^limit is the saturation bound
    if limit > math.log(finfo.max) - 1.0:  # β < e^−headroom: e^limit itself would overflow; exponentiate log β too
        exponent = log_ratio + log_beta
        return torch.exp(exponent.clamp_(max=limit + log_beta) if max_log_ratio > limit else exponent)
    value = torch.exp(log_ratio.clamp(max=limit) if max_log_ratio > limit else log_ratio)
    return value * beta if value.requires_grad else value.mul_(beta)


def _times(factor: Scalar, x: Tensor) -> Tensor:
    """factor·x, skipping the multiplication by a Python 1.0 (ρ ≡ 1, q ≡ 1)."""
    return x if isinstance(factor, float) and factor == 1.0 else factor * x


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """One row of the divergence table: `T = ρ·p + w·q` and `C_KL/β = a·ρ + w·b` (module docstring). Built with
    keywords only (`kw_only`): a row names every field it sets.

    Attributes:
        name: short name used in loss names (`rpg_<name>`, `rpg_reinforce_<name>`).
        paper_name: the paper's row name ("FKL", ...), used in RPG-<DIV> / RPG-REINFORCE-<DIV>.
        objective: the regulariser D in `J = E[R] − β·D`, with π_ref the KL reference.
        table_rho: p(log w, log ρ), the factor of ρ in T (None: no ρ term).
        table_w: q(log w, log ρ), the factor of w in T (None: no w term).
        kl_rho: a, the factor of ρ in C_KL/β.
        kl_w: b(log w, log ρ), the factor of w in C_KL/β (None: no w term).
        reverse: D is D(π_θ‖π_ref) (its `estimate` is w·k3(ρ/w)); else D(π_ref‖π_θ) (ρ·k3(w/ρ)).
        authors_clamp: whether the authors' code clamps this surrogate to ±10 (all but FKL; docs/differences.md#d3),
            i.e. whether the `kl_clamp` option acts on it.
        ratio_dependent_kl: whether C_KL depends on w (all but FKL, whose C_KL is the constant ρ), i.e. whether the
            `kl_ratio` option (C_KL at w̄ or w) acts on it.
        surrogate_adds_rho: whether `surrogate` is T plus the constant ρ (URKL only: Table 1 has `w·log w − w`, the
            surrogate `w·k3(ρ/w)` adds ρ so that it is a non-negative estimate). The constant does not change an
            additive regulariser's gradient, but it would change the θ-dependent Â of the literal Algorithm 1
            (`kl_placement="inside_clip"`), which uses T itself.
    """

    name: str
    paper_name: str
    objective: str
    table_rho: Optional[LogFn]
    table_w: Optional[LogFn]
    kl_rho: float
    kl_w: Optional[LogFn]
    reverse: bool
    authors_clamp: bool
    ratio_dependent_kl: bool
    surrogate_adds_rho: bool = False

    def table_loss(self, log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
        """T(w, ρ) = ρ·p + w·q, the paper's Table 1/4 per-token loss generalised to ρ ≠ 1."""
        terms = []
        if self.table_rho is not None:
            terms.append(_times(rho, self.table_rho(log_w, log_rho)))
        if self.table_w is not None:
            terms.append(_times(self.table_w(log_w, log_rho), w))
        return terms[0] if len(terms) == 1 else terms[0] + terms[1]

    def surrogate(self, log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
        """D̂(w, ρ): T, plus ρ for URKL (= w·k3(ρ/w)). Its gradient is −(C_KL/β)·∇log π_θ."""
        table = self.table_loss(log_w, w, log_rho, rho)
        return table + rho if self.surrogate_adds_rho else table

    def kl_component(self, log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
        """C_KL/β = a·ρ + w·b at the ratio (log_w, w) (a new tensor, never a view of ρ)."""
        if self.kl_w is None:
            return torch.full_like(w, self.kl_rho * rho) if isinstance(rho, float) else self.kl_rho * rho
        out = w * self.kl_w(log_w, log_rho)
        return out.add_(self.kl_rho * rho) if self.kl_rho else out

    def table_adv(self, log_w: Tensor, log_rho: Scalar, beta: float) -> Tensor:
        """β·T/w = β·(ρ/w)·p + β·q, the KL part of Â = A − β·T/w (Algorithm 1, `inside_clip`); finite value and
        gradient for every log w, log ρ within the guard (`scaled_ratio`)."""
        out = None
        if self.table_rho is not None:
            out = _scaled_inverse(log_w, log_rho, beta) * self.table_rho(log_w, log_rho)
        if self.table_w is not None:
            w_part = beta * self.table_w(log_w, log_rho)
            out = w_part if out is None else out + w_part
        return out

    def kl_adv(
        self,
        log_w: Tensor,
        log_rho: Scalar,
        beta: float,
        *,
        log_w_kl: Optional[Tensor],
        w: Optional[Tensor] = None,
        kl: Optional[Tensor] = None,
    ) -> Tensor:
        """β·C_KL(w_k)/w = a·β·(ρ/w) + β·(w_k/w)·b(log w_k), the KL part of the REINFORCE effective advantage
        A' = A + C/w (Algorithm 2 line 14: C at w_k = w̄ or w, divided by the raw w). Detached inputs; a new tensor.

        `log_w_kl` says where C_KL is evaluated, and nothing else does: None for the raw ratio (w_k = w), else the
        log-ratio log w_k (e.g. log w̄), even when its values equal `log_w`. The formula is chosen by this argument and
        by what is given, never by tensor identity, so a copy of an input cannot change the result.

        With a constant ρ (Python-scalar log ρ) and the raw ratio `w` given, it is one division of `kl` = β·C_KL(w_k)
        (given, or computed here when w_k = w) by w, without exponentials: within the guard |C_KL| ≤ 61·e^60 and
        1/w ≤ e^60, so C/w is finite in float32. Only with a tensor ρ can ρ/w reach e^120; then the sum above
        (`scaled_ratio`)."""
        exponentials = bool(self.kl_rho) or (self.kl_w is not None and log_w_kl is not None)
        if exponentials and w is not None and isinstance(log_rho, float) and (kl is not None or log_w_kl is None):
            if kl is None:
                kl = self.kl_component(log_w, w, log_rho, math.exp(log_rho)).mul_(beta)
            return kl / w
        out = _scaled_inverse(log_w, log_rho, beta * self.kl_rho) if self.kl_rho else None
        if self.kl_w is not None:
            if log_w_kl is not None:  # β·(w_k/w)·b(log w_k)
                w_part = torch.exp(log_w_kl - log_w).mul_(beta).mul_(self.kl_w(log_w_kl, log_rho))
            else:  # w_k = w: β·b(log w)
                b = self.kl_w(log_w, log_rho)
                w_part = torch.full_like(log_w, beta * b) if isinstance(b, float) else b * beta
            out = w_part if out is None else out.add_(w_part)
        return out

    def estimate(self, log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
        """Non-negative per-token estimate of D on π_old samples: w·k3(ρ/w) (reverse) or ρ·k3(w/ρ) (forward)."""
        return (w_k3 if self.reverse else rho_k3)(log_w, w, log_rho, rho)


def _scaled_inverse(log_w: Tensor, log_rho: Scalar, beta: float) -> Tensor:
    """β·ρ/w = `scaled_ratio(log ρ − log w)`; with ρ ≡ 1 the exponent −log w stays within the guard."""
    if isinstance(log_rho, float):
        return scaled_ratio(log_rho - log_w, beta, max_log_ratio=LOG_RATIO_GUARD + abs(log_rho))
    return scaled_ratio(log_rho - log_w, beta)


# The factors p, q, b of the rows (module docstring). A Python-scalar log ρ is folded into the constant, so that the
# iterative reference (log ρ = 0.0) costs one tensor operation per factor; a result may be `log_w` itself.
def _neg_log_r(log_w: Tensor, log_rho: Scalar) -> Tensor:
    return log_rho - log_w


def _ufkl_p(log_w: Tensor, log_rho: Scalar) -> Tensor:
    return (log_rho - 1.0) - log_w  # T = w − ρ − ρ·log(w/ρ) = ρ·k3(w/ρ)


def _log_r(log_w: Tensor, log_rho: Scalar) -> Tensor:
    return log_w if isinstance(log_rho, float) and log_rho == 0.0 else log_w - log_rho


def _log_r_minus_1(log_w: Tensor, log_rho: Scalar) -> Tensor:
    return log_w - (log_rho + 1.0)


def _minus_one(log_w: Tensor, log_rho: Scalar) -> float:
    return -1.0


def _one(log_w: Tensor, log_rho: Scalar) -> float:
    return 1.0


def _rkl_b(log_w: Tensor, log_rho: Scalar) -> Tensor:
    return (log_rho - 1.0) - log_w  # C_KL/β = −w·(log(w/ρ) + 1)  (Prop. E.3)


def _fkl_p(log_w: Tensor, log_rho: Scalar) -> Tensor:
    return -log_w  # T = −ρ·log w  (Table 4 `−β log π_θ` up to a constant; docs/losses.md#rho-weighting)


DIVERGENCES: dict[str, Divergence] = {
    d.name: d
    for d in (
        # FKL: T = −ρ·log w; C_KL/β = ρ (Prop. E.1 weight `w·R + β`)
        Divergence(
            name="fkl",
            paper_name="FKL",
            objective="KL(π_ref‖π_θ)",
            table_rho=_fkl_p,
            table_w=None,
            kl_rho=1.0,
            kl_w=None,
            reverse=False,
            authors_clamp=False,
            ratio_dependent_kl=False,
        ),
        # RKL: T = w·log(w/ρ); C_KL/β = −w·(log(w/ρ) + 1) (Prop. E.3)
        Divergence(
            name="rkl",
            paper_name="RKL",
            objective="KL(π_θ‖π_ref)",
            table_rho=None,
            table_w=_log_r,
            kl_rho=0.0,
            kl_w=_rkl_b,
            reverse=True,
            authors_clamp=True,
            ratio_dependent_kl=True,
        ),
        # UFKL: T = ρ·k3(w/ρ) = w − ρ − ρ·log(w/ρ) (Table 1, Remark 3.3); C_KL/β = ρ − w (Prop. 3.2)
        Divergence(
            name="ufkl",
            paper_name="UFKL",
            objective="UKL(π_ref‖π_θ)",
            table_rho=_ufkl_p,
            table_w=_one,
            kl_rho=1.0,
            kl_w=_minus_one,
            reverse=False,
            authors_clamp=True,
            ratio_dependent_kl=True,
        ),
        # URKL: T = w·log(w/ρ) − w (Table 1), D̂ = T + ρ = w·k3(ρ/w) (Remark 3.7); C_KL/β = −w·log(w/ρ) (Prop. 3.6)
        Divergence(
            name="urkl",
            paper_name="URKL",
            objective="UKL(π_θ‖π_ref)",
            table_rho=None,
            table_w=_log_r_minus_1,
            kl_rho=0.0,
            kl_w=_neg_log_r,
            reverse=True,
            authors_clamp=True,
            ratio_dependent_kl=True,
            surrogate_adds_rho=True,
        ),
    )
}


def w_k3(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """w·k3(ρ/w) = w·log(w/ρ) − w + ρ ≥ 0: the URKL surrogate, the importance-weighted GRPO KL `w·k3(π_ref/π_θ)`
    (paper §2.2; docs/losses.md#grpo-kl) and the reverse divergences' logged estimate."""
    return DIVERGENCES["urkl"].surrogate(log_w, w, log_rho, rho)


def rho_k3(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """ρ·k3(w/ρ) = w − ρ − ρ·log(w/ρ) ≥ 0: the UFKL surrogate and the forward divergences' logged estimate."""
    return DIVERGENCES["ufkl"].surrogate(log_w, w, log_rho, rho)
