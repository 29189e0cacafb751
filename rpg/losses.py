"""RPG policy losses: the two loss families of the paper, built from the divergence table.

Conventions (docs/losses.md#notation): every response token is one sampled item `x = (h_t, y_t)`; tensors are
(batch, response_len); `w = π_θ/π_old` per token; `A` is the sequence advantage broadcast over the response (detached
data); β = kl_coef; `(ε1, ε2, c)` = verl's `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`. The KL reference is
π_old (iterative, ρ ≡ 1) unless `ref_log_prob` is given (ρ = π_ref/π_old, docs/losses.md#rho-weighting).

Families
--------
* **Fully differentiable RPG** (`rpg_<div>`, paper rows RPG-<DIV>; Tables 1/4, Algorithm 1):
  - `kl_placement="additive"` (default; docs/losses.md#additive, what the paper's experiments ran): dual-clip PPO
    (§3.3 / App. G.1) on the detached advantage plus the unclipped regulariser, per token
    `L = L_dualclip(w, A) + β·D̂(w)`; inside the trust region `∇L = −(w·A + C_KL)·∇log π_θ`, the exact gradient of
    Props. E.1, E.3, 3.2, 3.6.
  - `kl_placement="inside_clip"` (literal Algorithm 1): dual clip on the θ-dependent `Â = A − β·T(w)/w`, T the
    Table 1/4 loss (URKL: without the surrogate's constant), which makes `−w·Â` the exact Table 1/4 surrogate when
    unclipped (docs/losses.md#inside-clip; the paper's own example Â's are the REINFORCE forms and are off by
    `+β·w·∇log π` per sample).
* **RPG-REINFORCE with RPG-Style Clip** (`rpg_reinforce_<div>`, Algorithm 2, Table 2 / App. F): per token with
  `ℓ = −log π_θ` (the only place the gradient enters), `C = β·C_KL` (at w̄ = clip(w) per Remark F.2 by default) and
  `A' = A + C/w`:

  | branch (ψ = A'·ℓ)          | loss value             | gradient                     |
  |----------------------------|------------------------|------------------------------|
  | A' ≥ 0, w < 1+ε2           | (w·A + C)·ℓ            | −(w·A + C)·∇log π_θ          |
  | A' ≥ 0, w ≥ 1+ε2           | ((1+ε2)·A + C)·SG(ℓ)   | 0                            |
  | A' < 0, w ≤ 1−ε1           | ((1−ε1)·A + C)·SG(ℓ)   | 0                            |
  | A' < 0, 1−ε1 < w < c       | (w·A + C)·ℓ            | −(w·A + C)·∇log π_θ          |
  | A' < 0, w ≥ c              | (c·A + C)·SG(ℓ)        | 0                            |

  (docs/losses.md#algorithm-2.) Its gradient equals dual-clip PPO on the detached `A'`
  (docs/losses.md#equivalence-with-dual-clip-ppo). The loss *value* is a log-prob scaled by a weight: do not compare
  `pg_loss` across families.
* **Hard-clip REINFORCE** (`rpg_reinforce_hardclip_<div>`, docs/losses.md#hard-clip; the authors' `rpg_rf_<div>`
  without `clip_ppo`, script `rkl1e-4_rf`): `L = SG(w̄·A + C)·ℓ` for every token — truncated IS in both directions,
  no dual clip, no flat regions.

Numerics (docs/losses.md#numerics): log-ratios are masked to 0 on padding (padding may hold NaN/inf garbage) and
limited to ±LOG_RATIO_GUARD; the KL parts of Â and A' are the divergence table's stable `table_adv`/`kl_adv` (no
division by w). Value and gradient are finite for every input, exact within the guard wherever representable. The
loss path never synchronises the device with the host except for one transfer of the stacked metrics.

The loss table (`LOSSES`, `LossSpec`, ...) lives in `rpg.loss_table` and is re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import torch

from rpg.install import require
from rpg.reference import adapter, step
from rpg.divergences import LOG_RATIO_GUARD, Divergence, guarded_log_ratio, scaled_ratio
from rpg.kl_aggregation import refuse_inexact_aggregation
from rpg.kl_credit import credited_kl_adv, credited_kl_weight, sequence_credit
from rpg.loss_table import (  # noqa: F401  (re-exported: rpg.launch and the tests import them from here)
    ADDON,
    DUAL_CLIP,
    FAMILIES,
    FD,
    HARDCLIP,
    LOSSES,
    RATIO_CLIP,
    REINFORCE,
    VERL_CLIP_FIELDS,
    Family,
    LossSpec,
    clip_fields,
    describe_losses,
    loss_spec,
)
from rpg.topk_loss import topk_loss, topk_metrics

if TYPE_CHECKING:  # verl's config classes; the tensor math above the verl wiring imports without verl (a GPU check)
    from rpg.loss_config import RPGPolicyLossConfig

Tensor = torch.Tensor

# Branch codes of the dual clip (both families), in the order of the table above.
BRANCHES = ("pos_grad", "pos_flat_high", "neg_flat_low", "neg_grad", "neg_flat_c")
POS_GRAD, POS_FLAT_HIGH, NEG_FLAT_LOW, NEG_GRAD, NEG_FLAT_C = range(5)


@dataclass(frozen=True)
class ClipParams:
    """Ratio clip of RPG-Style Clip: w̄ = clip(w, 1−ε1, 1+ε2); dual-clip bound c > 1 for negative advantages.

    No defaults here: the values are verl's actor fields (`rpg.loss_config.clip_settings`), the paper's are set by the
    recipes."""

    eps_low: float
    eps_high: float
    c: float


class Branches(NamedTuple):
    """The dual-clip branch of every token (BRANCHES) as the masks it is derived from, each bool (bs, T):

    pos_grad = positive & grad      pos_flat_high = positive & ~grad
    neg_grad = ~positive & grad     neg_flat_low = low      neg_flat_c = ~positive & ~grad & ~low
    """

    positive: Tensor  # the branch sign: A ≥ 0, Â ≥ 0, A' ≥ 0 or A > 0 (family/option)
    grad: Tensor  # a gradient branch (pos_grad or neg_grad)
    low: Tensor  # neg_flat_low (negative and w ≤ 1−ε1)

    def code(self) -> Tensor:
        """int8 branch code per token (the index in BRANCHES)."""
        neg = torch.where(self.low, NEG_FLAT_LOW, torch.where(self.grad, NEG_GRAD, NEG_FLAT_C))
        return torch.where(self.positive, torch.where(self.grad, POS_GRAD, POS_FLAT_HIGH), neg).to(torch.int8)


@dataclass
class TokenLoss:
    """Per-token loss matrix plus the detached quantities the metrics need; every tensor is (bs, T).

    Only `loss` is on the autograd graph.
    """

    loss: Tensor  # per-token loss, exactly zero on padding
    mask: Tensor  # bool: valid tokens
    w: Tensor  # detached importance ratio π_θ/π_old (1 on padding)
    log_w: Tensor  # detached log w (0 on padding)
    adv: Tensor  # detached advantage A (0 on padding)
    branches: Branches  # dual-clip branch masks, chosen by the sign of A, Â or A' (family/option)
    log_rho: Tensor | float = 0.0  # detached log ρ = log π_ref/π_old (0.0: iterative reference)
    rho: Tensor | float = 1.0
    kl_adv: Optional[Tensor] = None  # detached C/w (β included): the KL part added to the advantage, A' = A + C/w

    @property
    def branch(self) -> Tensor:
        """int8 dual-clip branch code per token (BRANCHES)."""
        return self.branches.code()


# ---------------------------------------------------------------------------------------------------------------
# shared pieces
# ---------------------------------------------------------------------------------------------------------------
def reference_ratio(
    old_log_prob: Tensor, ref_log_prob: Optional[Tensor], mask: Tensor
) -> tuple[Tensor | float, Tensor | float]:
    """(log ρ, ρ) with ρ = π_ref/π_old, detached (docs/losses.md#rho-weighting); (0.0, 1.0) for the iterative
    reference."""
    if ref_log_prob is None:
        return 0.0, 1.0
    log_rho = guarded_log_ratio(ref_log_prob.detach(), old_log_prob.detach(), mask)
    return log_rho, torch.exp(log_rho)


def dual_clip_branch(w: Tensor, positive: Tensor, clip: ClipParams) -> Branches:
    """The dual clip's rule, written once (paper §3.3, App. G.1; docs/losses.md#dual-clip): the branch of each token
    from its detached ratio `w` and its branch sign `positive` (bool):

    positive: w < 1+ε2 → POS_GRAD, else POS_FLAT_HIGH;
    negative: w ≤ 1−ε1 → NEG_FLAT_LOW, 1−ε1 < w < c → NEG_GRAD, w ≥ c → NEG_FLAT_C.

    Returned as the masks `Branches` (gradient branch, lower flat branch); `clipped_ratio`, `has_gradient`, the
    branch codes and the metric fractions are derived from them."""
    negative, low = ~positive, w <= 1.0 - clip.eps_low
    neg_grad = (w < clip.c).logical_and_(~low).logical_and_(negative)
    grad = (w < 1.0 + clip.eps_high).logical_and_(positive).logical_or_(neg_grad)
    return Branches(positive, grad, low.logical_and_(negative))


def has_gradient(branches: Branches) -> Tensor:
    """bool: the branch passes the gradient (POS_GRAD, NEG_GRAD); the flat branches do not."""
    return branches.grad


def clipped_ratio(w: Tensor, branches: Branches, clip: ClipParams) -> Tensor:
    """The ratio each dual-clip branch multiplies the advantage with: `w` (with its gradient) in the gradient
    branches, the bound 1+ε2, 1−ε1 or c (constant) in the flat ones. Dual-clip PPO per token is `−A·clipped_ratio`,
    i.e. `max(−w·A, −clip(w, 1−ε1, 1+ε2)·A)`, and for A < 0 its `min` with `−c·A`."""
    with torch.no_grad():  # the bound of each flat branch: clip(w, 1−ε1, c) is 1−ε1 or c in the negative ones
        bound = torch.where(branches.positive, 1.0 + clip.eps_high, w.detach().clamp(1.0 - clip.eps_low, clip.c))
    return torch.where(branches.grad, w, bound)


# ---------------------------------------------------------------------------------------------------------------
# the loss families (pure tensor functions)
# ---------------------------------------------------------------------------------------------------------------
def rpg_fully_differentiable(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    div: Divergence,
    beta: float,
    clip: ClipParams,
    kl_clamp: Optional[float] = None,
    kl_placement: str = "additive",
    ref_log_prob: Optional[Tensor] = None,
) -> TokenLoss:
    """RPG-<DIV>: fully differentiable surrogate with dual clip (Algorithm 1; docs/losses.md#additive,
    docs/losses.md#inside-clip).

    additive:    L = L_dualclip(w, SG(A)) + β·clamp?(D̂(w, ρ))
    inside_clip: L = L_dualclip(w, Â),  Â = A − β·clamp?(T(w, ρ))/w   (gradient flows through w and Â; T the Table
                 1/4 loss, i.e. D̂ without URKL's added constant ρ; β·T/w is `Divergence.table_adv`)

    `kl_clamp` (authors' code: 10, all divergences but FKL) clamps D̂ (T); None = paper.
    Shapes: all inputs (bs, T); `response_mask` bool. The loss is exactly 0 on padding.
    """
    mask = response_mask.bool()
    log_w = guarded_log_ratio(log_prob, old_log_prob.detach(), mask)
    w = torch.exp(log_w)
    w_detached = w.detach()
    log_rho, rho = reference_ratio(old_log_prob, ref_log_prob, mask)
    adv = torch.where(mask, advantages.detach(), 0.0)
    clamp = kl_clamp if kl_clamp is not None and div.authors_clamp else None
    if kl_placement == "additive":
        branches = dual_clip_branch(w_detached, adv >= 0, clip)
        # exactly 0 on padding without a final mask: there A = 0 and D̂(w = 1, ρ = 1) = 0
        loss = torch.addcmul(_regulariser(div, beta, clamp, log_w, w, log_rho, rho), adv,
                             clipped_ratio(w, branches, clip), value=-1.0)
    elif kl_placement == "inside_clip":
        kl_part = div.table_adv(log_w, log_rho, beta)  # β·T/w
        if clamp is not None:  # β·clamp(T)/w: ±β·kl_clamp/w where |T| > kl_clamp
            with torch.no_grad():
                table = div.table_loss(log_w, w, log_rho, rho)
            saturated = torch.sign(table) * clamp * scaled_ratio(-log_w, beta, max_log_ratio=LOG_RATIO_GUARD)
            kl_part = torch.where(table.abs() <= clamp, kl_part, saturated)
        adv_hat = adv - kl_part
        branches = dual_clip_branch(w_detached, adv_hat.detach() >= 0, clip)
        loss = torch.where(mask, -adv_hat * clipped_ratio(w, branches, clip), 0.0)  # URKL's β·T/w ≠ 0 on padding
    else:
        raise ValueError(f"kl_placement={kl_placement!r}; choose 'additive' or 'inside_clip'")
    return TokenLoss(loss, mask, w_detached, log_w.detach(), adv, branches, log_rho, rho)


def _regulariser(div: Divergence, beta: float, clamp: Optional[float], log_w: Tensor, w: Tensor,
                 log_rho: Tensor | float, rho: Tensor | float) -> Tensor:
    """β·clamp?(D̂(w, ρ)) per token, with its gradient; a 0-dim zero without building D̂ when β = 0 (kl_coef = 0, or
    the top-k KL in its place: `rpg.topk_loss`)."""
    if _no_kl(beta):
        return w.new_zeros(())
    regulariser = div.surrogate(log_w, w, log_rho, rho)
    if clamp is not None:
        regulariser = regulariser.clamp(-clamp, clamp)
    return regulariser * beta


def _no_kl(beta: Any) -> bool:
    """β is a Python 0: the loss has no sampled KL term (kl_coef = 0, or the top-k KL replaces it)."""
    return isinstance(beta, (int, float)) and beta == 0


def _kl_weight(div: Divergence, log_w: Tensor, log_w_kl: Optional[Tensor], w: Tensor, w_kl: Tensor,
               log_rho: Tensor | float, rho: Tensor | float, mask: Tensor, beta: float,
               kl_credit: str) -> tuple[Tensor, Tensor]:
    """(C, C/w) of Algorithm 2, detached: C = β·C_KL at (log w_k, w_k) (token credit) or the sequence credit's
    P_t·C − β·G_t / R_t·C (`rpg.kl_credit`); C/w divides by the raw w (Alg. 2 line 14). Both 0 without building
    C_KL when β = 0 (kl_coef = 0, or the top-k KL in its place)."""
    if kl_credit not in ("token", "sequence"):
        raise ValueError(f"kl_credit={kl_credit!r}; choose 'token' or 'sequence'")
    if _no_kl(beta):
        return torch.zeros_like(w), torch.zeros_like(w)
    kl_c = div.kl_component(log_w if log_w_kl is None else log_w_kl, w_kl, log_rho, rho).mul_(beta)
    if kl_credit == "sequence":
        kl_c = credited_kl_weight(sequence_credit(div, log_w, log_rho, mask, beta), kl_c)
        return kl_c, credited_kl_adv(kl_c, log_w, mask)
    return kl_c, div.kl_adv(log_w, log_rho, beta, log_w_kl=log_w_kl, w=w, kl=kl_c)


def rpg_reinforce(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    div: Divergence,
    beta: float,
    clip: ClipParams,
    branch_on: str = "effective_advantage",
    kl_ratio: str = "clipped",
    hard_clip: bool = False,
    ref_log_prob: Optional[Tensor] = None,
    kl_credit: str = "token",
) -> TokenLoss:
    """RPG-REINFORCE with RPG-Style Clip (Algorithm 2; docs/losses.md#algorithm-2), or the hard-clip variant
    (docs/losses.md#hard-clip).

    C = β·C_KL(w̄ or w, ρ) (Remark F.2: w̄ by default), A' = A + C/w (`Divergence.kl_adv`), ℓ = −log π_θ;
    per-token loss `weight · ℓ` where the gradient flows only in the "grad" branches (table in the module doc).
    `branch_on="advantage"` branches on sign(A) with A = 0 negative, as the authors' code does
    (docs/differences.md#d4, (b)).
    `hard_clip=True`: weight = w̄·A + C on every token, always with gradient.
    `kl_credit="sequence"`: C → P_t·C − β·G_t (reverse rows) or R_t·C (forward rows), the sequence-level KL
    (`rpg.kl_credit`, docs/losses.md#kl-credit).
    Shapes: all inputs (bs, T); `response_mask` bool. The loss is exactly 0 on padding.
    """
    mask = response_mask.bool()
    with torch.no_grad():
        log_w = guarded_log_ratio(log_prob.detach(), old_log_prob, mask)
        w = torch.exp(log_w)
        log_rho, rho = reference_ratio(old_log_prob, ref_log_prob, mask)
        adv = torch.where(mask, advantages, 0.0)
        w_bar = w.clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high)
        if kl_ratio == "clipped":  # log w̄ = clip(log w) (log is monotonic)
            log_w_kl = log_w.clamp(math.log(1.0 - clip.eps_low), math.log(1.0 + clip.eps_high))
            w_kl = w_bar
        elif kl_ratio == "raw":
            log_w_kl, w_kl = None, w
        else:
            raise ValueError(f"kl_ratio={kl_ratio!r}; choose 'clipped' or 'raw'")
        kl_c, kl_adv = _kl_weight(div, log_w, log_w_kl, w, w_kl, log_rho, rho, mask, beta, kl_credit)
        if branch_on == "effective_advantage":
            positive = (adv + kl_adv) >= 0
        elif branch_on == "advantage":
            positive = adv > 0
        else:
            raise ValueError(f"branch_on={branch_on!r}; choose 'effective_advantage' or 'advantage'")
        branches = dual_clip_branch(w, positive, clip)
        if hard_clip:
            weight = torch.addcmul(kl_c, w_bar, adv)
        else:
            weight = torch.addcmul(kl_c, clipped_ratio(w, branches, clip), adv)
            flat_log_prob = torch.where(mask, log_prob.detach(), 0.0)  # log π_θ without gradient, 0 on padding
    # loss = weight·ℓ = −weight·log π_θ (0 on padding), the gradient flowing only in the gradient branches
    if hard_clip:
        loss = torch.where(mask, log_prob, 0.0) * weight.neg_()
    else:
        loss = torch.where(branches.grad & mask, log_prob, flat_log_prob) * weight.neg_()
    return TokenLoss(loss, mask, w, log_w, adv, branches, log_rho, rho, kl_adv)


# ---------------------------------------------------------------------------------------------------------------
# verl wiring: registered functions with verl 0.9.1's PolicyLossFn signature
# ---------------------------------------------------------------------------------------------------------------
def sampled_estimate(out: TokenLoss, div: Divergence) -> Tensor:
    """The per-token estimate of D(π_θ, π_ref) from the sampled token (`Divergence.estimate`: k3-type, ≥ 0), detached,
    (bs, T): 0 on padding (log w = 0, w = ρ = 1 there). `actor/rpg/kl`, and the KL the loss regularises with
    kl_estimator=sampled."""
    with torch.no_grad():
        return div.estimate(out.log_w, out.w, out.log_rho, out.rho)


def metric_statistics(out: TokenLoss, div: Divergence, beta: float, estimate: Optional[Tensor] = None) -> Tensor:
    """The sufficient statistics of the dashboard metrics (`_metrics`), over the valid tokens only, as ONE float64
    vector on the loss's device (no host synchronisation), in the order of `STATISTICS`: the numbers of valid tokens
    counted from the left of BRANCHES (their differences are the five branch counts), the sums of w, log w, the KL
    estimate (`estimate`, `sampled_estimate` if not given), |C/w| and |A|, and the largest and smallest w."""
    if estimate is None:
        estimate = sampled_estimate(out, div)
    with torch.no_grad():
        mask, br, w = out.mask, out.branches, out.w
        low = br.positive | br.low
        left = torch.stack([br.positive & br.grad, br.positive, low, low | br.grad, mask]).logical_and_(mask)
        counts = left.view(torch.uint8).flatten(1).sum(1, dtype=torch.int32)
        valid = _as_float(mask, w.dtype)
        w_valid = w * valid  # w > 0 on valid tokens: the 0 of padding is never the maximum
        kl_adv = out.kl_adv if out.kl_adv is not None else div.kl_adv(out.log_w, out.log_rho, beta, log_w_kl=None, w=w)
        # padding holds log w = 0, A = 0 and a zero KL estimate (w = ρ = 1): their sums need no mask
        f64 = torch.float64  # sums of saturated float32 terms stay finite
        kl_adv = kl_adv.mul_(valid) if out.kl_adv is None else kl_adv * valid
        w_min = torch.add(w_valid, 1.0 - valid, alpha=torch.finfo(w.dtype).max).amin()
        sums = torch.stack([
            w_valid.sum(dtype=f64),
            out.log_w.sum(dtype=f64),
            estimate.sum(dtype=f64),
            kl_adv.abs_().sum(dtype=f64),
            out.adv.abs().sum(dtype=f64),
            w_valid.amax().double(),
            w_min.double(),
        ])
        return torch.cat([counts.double(), sums])


STATISTICS = (
    "n_pos_grad", "n_pos", "n_pos_or_low", "n_not_flat_c", "n", "sum_w", "sum_log_w", "sum_kl", "sum_abs_kl_adv",
    "sum_abs_adv", "max_w", "min_w",
)


def _as_float(flags: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool tensor as 0/1 of `dtype` (through uint8: the direct bool conversion is several times slower on CPU)."""
    return flags.view(torch.uint8).to(dtype)


def _metrics(out: TokenLoss, div: Divergence, beta: float, estimate: Optional[Tensor] = None) -> dict[str, float]:
    """Dashboard metrics over the valid tokens, with ONE device→host transfer (of `metric_statistics`; verl's
    `Metric` would call `.item()` on each tensor); {} for a micro-batch without valid tokens.

    actor/rpg/kl            mean per-token estimate of D(π_θ, π_ref) (k3-type, ≥ 0; `Divergence.estimate`)
    actor/rpg/frac_<branch> fraction of tokens in each dual-clip branch (BRANCHES)
    actor/rpg/kl_adv_abs    mean |C/w|: the KL part of the effective advantage A' = A + C/w (both families:
                            the fully differentiable KL term has gradient weight C_KL(w) per token)
    actor/rpg/kl_adv_rel    mean |C/w| / mean |A|
    actor/rpg/ratio_{mean,max,min}
    and verl's standard actor/ppo_kl, actor/pg_clipfrac (flat branches at 1±ε), actor/pg_clipfrac_lower (at c).
    """
    s = dict(zip(STATISTICS, metric_statistics(out, div, beta, estimate).tolist()))
    n = s["n"]
    if n == 0:
        return {}
    left = [0.0, s["n_pos_grad"], s["n_pos"], s["n_pos_or_low"], s["n_not_flat_c"], n]
    metrics = {f"actor/rpg/frac_{name}": (left[i + 1] - left[i]) / n for i, name in enumerate(BRANCHES)}
    kl_abs = s["sum_abs_kl_adv"] / n
    metrics.update(
        {
            "actor/rpg/kl": s["sum_kl"] / n,
            "actor/rpg/kl_adv_abs": kl_abs,
            "actor/rpg/kl_adv_rel": kl_abs / max(s["sum_abs_adv"] / n, 1e-12),
            "actor/rpg/ratio_mean": s["sum_w"] / n,
            "actor/rpg/ratio_max": s["max_w"],
            "actor/rpg/ratio_min": s["min_w"],
            "actor/ppo_kl": -s["sum_log_w"] / n,
            "actor/pg_clipfrac": metrics["actor/rpg/frac_pos_flat_high"] + metrics["actor/rpg/frac_neg_flat_low"],
            "actor/pg_clipfrac_lower": metrics["actor/rpg/frac_neg_flat_c"],
        }
    )
    return metrics


def _ref_log_prob(settings: RPGPolicyLossConfig, loss_name: str) -> Optional[Tensor]:
    """The reference log-probs of the current micro-batch, or None for the iterative reference (ρ ≡ 1)."""
    if not settings.needs_ref_log_prob:
        return None
    require(settings)  # the adapter is installed in this process
    ref = adapter.current_ref_log_prob()
    if ref is None:
        raise ValueError(
            f"{loss_name} with reference={settings.reference!r} needs the reference model's log-probs, but verl did "
            "not ship `ref_log_prob`. Set actor_rollout_ref.actor.use_kl_loss=True and "
            "actor_rollout_ref.actor.kl_loss_coef=0 (verl then builds the reference model and adds no KL of its own). "
            "(Also raised when the loss is called outside verl's ppo_loss, e.g. by distillation_ppo_loss, which the "
            "ref_log_prob adapter does not cover.)"
        )
    return ref


def _agg_loss(loss_mat: Tensor, mask: Tensor, loss_agg_mode: str, batch_info: dict) -> Tensor:
    """verl's `agg_loss` in the run's `loss_agg_mode` over the global batch."""
    from verl.trainer.ppo.core_algos import agg_loss

    return agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **batch_info)


class LossTerm(NamedTuple):
    """What the part of a loss that differs between the RPG losses and the KL add-on hands `policy_loss_fn`."""

    loss: Tensor  # (bs, T) per-token loss, before the rollout weights and the aggregation
    mask: Tensor  # bool (bs, T): the valid tokens
    kl: Tensor  # (bs, T) detached per-token KL the loss regularises, 0 on masked tokens: what the adaptive β tracks
    finish: Callable[[Tensor], tuple[Tensor, dict[str, Any]]]  # aggregated loss -> (loss, metrics)


def hand_kl_to_step(kl: Tensor, mask: Tensor) -> None:
    """(Σ KL, #tokens) of the KL the loss regularises (`LossTerm.kl`), as one float64 tensor on the loss's device (no
    host synchronisation), to the training step when it measures it: the adaptive β's input
    (`rpg.reference.adaptive_kl`, docs/losses.md#adaptive-beta). Nothing outside such a step."""
    if step.measures_loss_kl():
        step.add_loss_kl(torch.stack([kl.sum(dtype=torch.float64), mask.sum(dtype=torch.float64)]))


def policy_loss_fn(
    spec: LossSpec,
    config_use: str,
    term: Callable[..., LossTerm],
    aggregate: Callable[[Tensor, Tensor, str, dict], Tensor] = _agg_loss,
):
    """verl's `PolicyLossFn` of one loss-table row around `term`, the part that differs between the RPG losses and
    the KL add-on.

    The returned function has verl 0.9.1's signature `(old_log_prob, log_prob, advantages, response_mask,
    loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)`; `config` is verl's ActorConfig whose
    `policy_loss` is an `RPGPolicyLossConfig`. It reads the settings, the reference log-probs (`_ref_log_prob`) and
    β (`rpg.reference.step.kl_coef`: kl_coef, or the adaptive β of this training step), calls
    `term(settings, config, inputs, ref, beta) -> LossTerm` with `inputs` the first five arguments and
    `rollout_is_weights`, hands the KL the term regularises to the training step once (`hand_kl_to_step`: the
    adaptive β's input; the metrics only measure), multiplies the per-token loss by `rollout_is_weights` (verl's TIS
    correction of the rollout/π_old mismatch, as in verl's vanilla loss) on the mask, aggregates it over the global
    batch with `aggregate(loss, mask, loss_agg_mode, global_batch_info)` (verl's `agg_loss` in the run's mode; the
    add-on's KL: `rpg.kl_addon.aggregate_kl`) and returns `finish(aggregated loss)`. An aggregation that makes the
    KL inexact is refused here too, with the launcher's message (`rpg.kl_aggregation.refuse_inexact_aggregation`).
    """

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Optional[Tensor] = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        if config is None:
            raise ValueError(f"{spec.name} needs verl's actor config ({config_use})")
        settings = _settings(config)
        inputs = (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, rollout_is_weights)
        ref, beta = _ref_log_prob(settings, spec.name), step.kl_coef(settings)
        loss_mat, mask, kl, finish = term(settings, config, inputs, ref, beta)
        hand_kl_to_step(kl, mask)
        if rollout_is_weights is not None:
            loss_mat = loss_mat * torch.where(mask, rollout_is_weights, 0.0)
        batch_info = config.get("global_batch_info", None) or {}
        refuse_inexact_aggregation(spec.name, spec.family == ADDON, loss_agg_mode, batch_info)
        return finish(aggregate(loss_mat, response_mask, loss_agg_mode, batch_info))

    policy_loss.__name__ = policy_loss.__qualname__ = f"compute_policy_loss_{spec.name}"
    policy_loss.__doc__ = f"verl policy loss `{spec.name}` ({spec.paper_row}): {spec.description}"
    return policy_loss


def _settings(config: Any) -> RPGPolicyLossConfig:
    """The `RPGPolicyLossConfig` of verl's actor config (`rpg.loss_config.rpg_settings`)."""
    from rpg.loss_config import rpg_settings  # imports verl's config classes: the tensor math above imports without

    return rpg_settings(config)


def _clip(config: Any, spec: LossSpec) -> ClipParams:
    """(ε1, ε2, c) of verl's actor fields, the ones `spec` reads validated (`rpg.loss_config.clip_settings`)."""
    from rpg.loss_config import clip_settings  # imports verl's config classes: the tensor math above imports without

    return ClipParams(*clip_settings(config, spec.clip_fields, spec.name))


def make_policy_loss(spec: LossSpec):
    """Build the verl `PolicyLossFn` of one RPG row of the loss table (`policy_loss_fn`): the clip fields the row
    reads are validated at each call; the per-token loss of its family. One device→host transfer per call (the
    metrics)."""
    div = spec.divergence

    def term(settings: RPGPolicyLossConfig, config: Any, inputs: tuple, ref: Optional[Tensor], beta: float):
        old_log_prob, log_prob, advantages, response_mask = inputs[:4]
        clip = _clip(config, spec)
        topk = settings.topk  # the top-k KL replaces the sampled regulariser: the reward part has no KL term (β = 0)
        reward_beta = 0.0 if topk else beta
        family_inputs = (log_prob, old_log_prob, advantages, response_mask, div, reward_beta, clip)
        if spec.family == FD:
            options = dict(kl_clamp=settings.kl_clamp, kl_placement=settings.kl_placement)
            out = rpg_fully_differentiable(*family_inputs, ref_log_prob=ref, **options)
        else:
            options = dict(branch_on=settings.branch_on, kl_ratio=settings.kl_ratio, kl_credit=settings.kl_credit)
            out = rpg_reinforce(*family_inputs, hard_clip=spec.family == HARDCLIP, ref_log_prob=ref, **options)
        estimate = sampled_estimate(out, div)  # actor/rpg/kl; the regularised KL of kl_estimator=sampled
        if not topk:
            return LossTerm(out.loss, out.mask, estimate, lambda loss: (loss, _metrics(out, div, beta, estimate)))
        kl = topk_loss(settings, div, log_prob, old_log_prob, ref, response_mask, beta, advantages)

        def finish(loss: Tensor) -> tuple[Tensor, dict[str, Any]]:
            # the reward part's C/w is 0 (β = 0): actor/rpg/kl_adv_abs reads 0, the KL sits outside the clip
            return loss, {**_metrics(out, div, reward_beta, estimate), **topk_metrics(kl, out.mask)}

        return LossTerm(out.loss + kl.loss, out.mask, kl.kl, finish)

    return policy_loss_fn(spec, "clip ratios, policy_loss settings", term)
