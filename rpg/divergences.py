"""The four KL divergences of RPG, defined once.

Every formula of the paper that depends on the divergence is one of three per-token quantities, all functions of
the importance ratio `w = π_θ/π_old` (`log_w = log π_θ − log π_old`) and of the reference ratio
`ρ = π_ref/π_old` (`log_ρ`; ρ ≡ 1 under the iterative reference π_ref = π_old, paper §5):

* `surrogate`  — the fully differentiable KL regulariser (minimised, multiplied by β), paper Table 1 (UFKL, URKL) and
  Table 4 (FKL, RKL), generalised to a reference π_ref ≠ π_old with the detached ratio ρ (docs/losses.md#rho-weighting).
  Its gradient is `∇surrogate = −C_KL/β · ∇log π_θ` for every sample (docs/losses.md#fully-differentiable-surrogates,
  per-sample check).
* `kl_component` — `C_KL/β`, the KL part of the REINFORCE weight `Weight = w·A + C_KL` (paper Table 2;
  docs/losses.md#reinforce-style-losses; Props. F.1, F.3, F.4, F.5 for ρ ≡ 1). Used inside a stop-gradient by the
  REINFORCE family (Algorithm 2).
* `estimate`  — a non-negative, unbiased per-token estimate of the divergence value on π_old samples, for logging:
  `ρ·k3(w/ρ)` for the forward divergences and `w·k3(ρ/w)` for the reverse ones (k3 ≡ UKL, paper App. D, Remark 3.5).

With ρ ≡ 1:

| div  | surrogate (Tables 1/4)   | C_KL/β (App. F)    | objective                      |
|------|--------------------------|--------------------|--------------------------------|
| fkl  | −log w                   | +1                 | E[R] − β·KL(π_old‖π_θ)   (E.1) |
| ufkl | w − log w − 1  (= k3(w)) | 1 − w              | E[R] − β·UKL(π_old‖π_θ)  (3.1) |
| rkl  | w·log w                  | −w·(log w + 1)     | E[R] − β·KL(π_θ‖π_old)   (E.2) |
| urkl | w·log w − w + 1          | −w·log w           | E[R] − β·UKL(π_θ‖π_old)  (3.3) |

For normalised policies UKL = KL, so UFKL/FKL (and URKL/RKL) are the same objective; their estimators differ by the
zero-mean control variate ±β·w (docs/losses.md#control-variates), which the tests check exactly.

All functions are elementwise on tensors of any shape (typically (batch, response_len)); `log_rho`/`rho` may be the
Python scalars 0.0/1.0 (iterative reference) to skip work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import torch

Tensor = torch.Tensor
Scalar = Union[Tensor, float]
RatioFn = Callable[[Tensor, Tensor, Scalar, Scalar], Tensor]


# ---- forward divergences: D(π_ref ‖ π_θ) --------------------------------------------------------------------------
def _fkl_surrogate(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """−ρ·log w (Table 4 FKL `−β log π_θ` up to a constant; docs/losses.md#rho-weighting `−SG(ρ)·log π_θ`)."""
    return -rho * log_w


def _ufkl_surrogate(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """ρ·k3(w/ρ) = w − ρ − ρ·(log w − log ρ) (Table 1 UFKL `w − log w − 1` at ρ = 1; Remark 3.3)."""
    return w - rho - rho * (log_w - log_rho)


def _fkl_component(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """+ρ (Prop. E.1 weight `w·R + β`)."""
    return torch.full_like(w, rho) if not isinstance(rho, Tensor) else rho.expand_as(w)


def _ufkl_component(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """ρ − w (Prop. 3.2 weight `w·R − β·(w − 1)`)."""
    return rho - w


# ---- reverse divergences: D(π_θ ‖ π_ref) --------------------------------------------------------------------------
def _rkl_surrogate(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """w·log(π_θ/π_ref) = w·(log w − log ρ) (Table 4 RKL `w·log w`)."""
    return w * (log_w - log_rho)


def _urkl_surrogate(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """w·k3(ρ/w) = w·(log w − log ρ) − w + ρ (Table 1 URKL `w·log w − w` plus a constant; Remark 3.7).

    With a frozen reference this is exactly the importance-weighted GRPO KL `w·k3(π_ref/π_θ)` (paper §2.2;
    docs/losses.md#grpo-kl).
    """
    return w * (log_w - log_rho) - w + rho


def _rkl_component(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """−w·(log w − log ρ + 1) (Prop. E.3 weight `w·(R − β(log w + 1))`)."""
    return -w * (log_w - log_rho + 1.0)


def _urkl_component(log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
    """−w·(log w − log ρ) (Prop. 3.6 weight `w·(R − β·log w)`)."""
    return -w * (log_w - log_rho)


@dataclass(frozen=True)
class Divergence:
    """One row of the divergence table.

    Attributes:
        name: short name used in loss names (`rpg_<name>`, `rpg_reinforce_<name>`).
        paper_name: the paper's row name ("FKL", ...), used in RPG-<DIV> / RPG-REINFORCE-<DIV>.
        objective: the regulariser D in `J = E[R] − β·D`, with π_ref the KL reference.
        surrogate: fully differentiable per-token regulariser (see module docstring).
        kl_component: C_KL/β of the REINFORCE weight.
        estimate: non-negative per-token estimate of D on π_old samples (for logging).
        reference_clamps: whether the authors' code clamps this surrogate to ±10 (all but FKL; docs/differences.md#d3),
            i.e. whether the `kl_clamp` option acts on it.
        ratio_dependent_kl: whether C_KL depends on w (all but FKL, whose C_KL is the constant ρ), i.e. whether the
            `kl_ratio` option (C_KL at w̄ or w) acts on it.
        surrogate_adds_rho: whether `surrogate` is the paper's Table 1/4 loss plus the constant ρ (URKL only: Table 1
            has `w·log w − w`, the surrogate `w·k3(ρ/w)` adds ρ so that it is a non-negative estimate). The constant
            does not change an additive regulariser's gradient, but it does change the θ-dependent Â of the literal
            Algorithm 1 (`kl_placement="inside_clip"`), which uses the Table loss itself.
    """

    name: str
    paper_name: str
    objective: str
    surrogate: RatioFn
    kl_component: RatioFn
    estimate: RatioFn
    reference_clamps: bool
    ratio_dependent_kl: bool
    surrogate_adds_rho: bool = False

    def table_loss(self, log_w: Tensor, w: Tensor, log_rho: Scalar, rho: Scalar) -> Tensor:
        """The paper's Table 1/4 per-token loss (generalised to ρ ≠ 1 as `surrogate` is): `surrogate` minus its
        added constant."""
        surrogate = self.surrogate(log_w, w, log_rho, rho)
        return surrogate - rho if self.surrogate_adds_rho else surrogate


DIVERGENCES: dict[str, Divergence] = {
    d.name: d
    for d in (
        Divergence("fkl", "FKL", "KL(π_ref‖π_θ)", _fkl_surrogate, _fkl_component, _ufkl_surrogate, False, False),
        Divergence("rkl", "RKL", "KL(π_θ‖π_ref)", _rkl_surrogate, _rkl_component, _urkl_surrogate, True, True),
        Divergence("ufkl", "UFKL", "UKL(π_ref‖π_θ)", _ufkl_surrogate, _ufkl_component, _ufkl_surrogate, True, True),
        Divergence("urkl", "URKL", "UKL(π_θ‖π_ref)", _urkl_surrogate, _urkl_component, _urkl_surrogate, True, True,
                   surrogate_adds_rho=True),
    )
}


def get_divergence(name: str) -> Divergence:
    """Look up a divergence by name, with an error listing the valid names."""
    try:
        return DIVERGENCES[name]
    except KeyError:
        raise ValueError(f"Unknown RPG divergence {name!r}; choose one of {sorted(DIVERGENCES)}") from None
