"""The KL computed at k tokens per position instead of sampled: top-k support, analytic KL, tail, KL share.

docs/losses.md#topk-kl derives every formula here. Per position (one response token, history h):
p = π_θ(·|h) = softmax(z) with z the current logits (gradient), q = π_ref(·|h) (the KL reference, detached; π_old
for the iterative reference), μ = π_old(·|h) the sampler, y ~ μ the sampled token, w = p_y/μ_y, ρ = q_y/μ_y, S the
support (k token ids fixed before the update, detached), T = V∖S, p_T = 1 − Σ_S p, q_T = 1 − Σ_S q.

    reverse  KL(p‖q) ≈ Σ_S p_v·log(p_v/q_v) + tail,   bucket  p_T·log(p_T/q_T)    sampled  1[y∈T]·w·log(p_y/q_y)
    forward  KL(q‖p) ≈ Σ_S q_v·log(q_v/p_v) + tail,   bucket  q_T·log(q_T/p_T)    sampled  1[y∈T]·ρ·log(q_y/p_y)

The analytic part and the bucket tail are functions of the current logits at the visited history (`topk_kl`: one
value per token, the shape the engine's logits hook accepts); the sampled tail is a function of the sampled
token's log-probabilities only (`sampled_tail`). The analytic part is not multiplied by w (docs/losses.md#topk-kl).
Only the normalised form is offered (the unnormalised one adds Σ_S(q − p) + (q_T − p_T), zero per position for
the bucket tail and zero in expectation, not per sample, for the sampled one).

Memory: the support is (N, k) int32 ids + (N, k) fp32 log-probs; the log-sum-exp over the vocabulary is chunked
over tokens (`chunk_tokens` rows of fp32 at a time, forward and backward) and saves nothing of size (N, V) beyond the
logits themselves. Numerics: padding rows (`mask` False) may hold NaN/inf garbage and get value and gradient 0;
every log-ratio is limited to ±LOG_RATIO_GUARD (the package's one guard) with zero gradient beyond it, so extreme or
−inf logits give finite values and gradients. torch only (no verl import).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from rpg import modes
from rpg.divergences import LOG_RATIO_GUARD, guarded_log_ratio
from rpg.kl_credit import exclusive_prefix_sum, exclusive_suffix_sum

Tensor = torch.Tensor

DIRECTIONS = ("reverse", "forward")
TAILS = tuple(modes.TOPK_TAILS)  # the rows of rpg.modes (policy_loss.kl_topk_tail)
DEFAULT_CHUNK_TOKENS = 1024  # rows of (chunk, V) fp32 at a time: 0.6 GB at V = 152k

__all__ = [
    "DIRECTIONS",
    "TAILS",
    "Support",
    "TopKKL",
    "KLShare",
    "check_k",
    "check_options",
    "chunked_logsumexp",
    "select_support",
    "gather_log_probs",
    "in_support",
    "topk_kl",
    "sampled_tail",
    "sequence_credited",
    "kl_share",
    "ShareMoments",
    "share_moments",
    "kl_share_from_moments",
    "share_ratio",
]


# ---- options ---------------------------------------------------------------------------------------------------
def check_k(k: int, vocab_size: int, setting: str = "k") -> int:
    """k as an int in [1, vocab_size], else a ValueError naming the setting, the value and the valid range."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab_size:
        raise ValueError(
            f"{setting}={k!r}: the top-k KL support holds k distinct token ids per position, so k must be an integer "
            f"with 1 ≤ k ≤ the vocabulary size ({vocab_size}); choose a smaller k"
        )
    return k


def check_options(direction: str, tail: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}; choose one of {DIRECTIONS}")
    if tail not in TAILS:
        raise ValueError(f"tail={tail!r}; choose one of {TAILS}")


# ---- the log-sum-exp over the vocabulary, chunked ------------------------------------------------------------------
def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(logits: Tensor, valid: Tensor, s: int, e: int) -> Tensor:
    """Rows s:e of the logits in the working dtype, padding rows replaced by 0 (garbage never enters a reduction)."""
    x = logits[s:e].to(_work_dtype(logits.dtype))
    return torch.where(valid[s:e, None], x, 0.0)


class _ChunkedLogSumExp(torch.autograd.Function):
    """Per row: log Σ_V exp(z), the logits at `ids` (N, k) (both with gradient) and Σ_V softmax(z)² (none), `chunk`
    rows at a time. The backward writes softmax·g_lse chunk by chunk straight into the gradient's memory and adds
    the gathered entries' gradient in place: no (N, V) working copy and no second (N, V) gradient to sum. Rows
    outside `valid` get lse 0, gathered logits 0 and gradient 0 whatever they hold (NaN/inf garbage included)."""

    @staticmethod
    def forward(ctx, logits, ids, valid, chunk, want_sq):
        n, dt = logits.shape[0], _work_dtype(logits.dtype)
        lse = torch.zeros(n, dtype=dt, device=logits.device)
        sq = torch.zeros(n if want_sq else 0, dtype=dt, device=logits.device)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            x = logits[s:e].to(dt)
            lse[s:e] = torch.where(valid[s:e], torch.logsumexp(x, -1), 0.0)
            if want_sq:
                sq[s:e] = torch.where(valid[s:e], torch.exp(2.0 * (x - lse[s:e, None])).sum(-1), 0.0)
        z_s = torch.where(valid[:, None], logits.gather(-1, ids).to(dt), 0.0)
        ctx.save_for_backward(logits, ids, valid, lse)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(sq)
        return lse, z_s, sq

    @staticmethod
    def backward(ctx, g_lse, g_zs, _g_sq):
        logits, ids, valid, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        g = torch.zeros_like(lse) if g_lse is None else torch.where(valid, g_lse, 0.0)
        for s in range(0, logits.shape[0], ctx.chunk):
            e = min(s + ctx.chunk, logits.shape[0])
            x = logits[s:e]
            if x.dtype == lse.dtype:  # softmax·g written straight into the gradient's rows
                out = torch.sub(x, lse[s:e, None], out=grad[s:e]).exp_().mul_(g[s:e, None])
            else:
                out = grad[s:e].copy_((x.to(lse.dtype) - lse[s:e, None]).exp_().mul_(g[s:e, None]))
            out.masked_fill_(~valid[s:e, None], 0.0)
        if g_zs is not None:
            grad.scatter_add_(-1, ids, torch.where(valid[:, None], g_zs, 0.0).to(grad.dtype))
        return grad, None, None, None, None


def chunked_logsumexp(
    logits: Tensor, mask: Optional[Tensor] = None, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, with_sum_sq: bool = False
) -> tuple[Tensor, Tensor]:
    """(lse (N,), Σ_V p² (N,) or empty) of `logits` (N, V) in fp32 (fp64 for fp64 logits); 0 on padding rows."""
    lse, _, sq = _logsumexp_and_gather(
        logits, logits.new_zeros(logits.shape[0], 0, dtype=torch.long), mask, chunk_tokens, with_sum_sq
    )
    return lse, sq


def _logsumexp_and_gather(logits, ids, mask, chunk_tokens, with_sum_sq):
    return _ChunkedLogSumExp.apply(logits, ids.long(), _valid(logits, mask), int(chunk_tokens), bool(with_sum_sq))


def _valid(logits: Tensor, mask: Optional[Tensor]) -> Tensor:
    if mask is None:
        return torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
    return mask.reshape(-1).to(device=logits.device, dtype=torch.bool)


# ---- the support, fixed before the update (no gradient) ------------------------------------------------------------
class Support(NamedTuple):
    """The support S of each position and the reference's log-probabilities there."""

    ids: Tensor  # (N, k) int32 token ids
    log_probs: Tensor  # (N, k) fp32 (fp64 for fp64 logits): log q at ids


@torch.no_grad()
def select_support(
    logits: Tensor, k: int, mask: Optional[Tensor] = None, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> Support:
    """The k most probable ids of softmax(logits) (N, V) per row and their log-probs (the old-log-prob or reference
    pass). Padding rows get finite placeholder values."""
    n, vocab = logits.shape
    check_k(k, vocab)
    valid = _valid(logits, mask)
    ids = torch.empty(n, k, dtype=torch.int32, device=logits.device)
    vals = torch.empty(n, k, dtype=_work_dtype(logits.dtype), device=logits.device)
    for s in range(0, n, chunk_tokens):
        e = min(s + chunk_tokens, n)
        top = torch.log_softmax(_rows(logits, valid, s, e), -1).topk(k, -1)
        vals[s:e], ids[s:e] = top.values, top.indices.to(torch.int32)
    return Support(ids, vals)


@torch.no_grad()
def gather_log_probs(
    logits: Tensor, ids: Tensor, mask: Optional[Tensor] = None, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> Tensor:
    """log softmax(logits) at `ids` (N, k), e.g. π_ref's log-probs at π_old's support (the reference pass)."""
    valid = _valid(logits, mask)
    out = torch.empty(ids.shape, dtype=_work_dtype(logits.dtype), device=logits.device)
    for s in range(0, logits.shape[0], chunk_tokens):
        e = min(s + chunk_tokens, logits.shape[0])
        x = _rows(logits, valid, s, e)
        out[s:e] = x.gather(-1, ids[s:e].long()) - torch.logsumexp(x, -1, keepdim=True)
    return out


def in_support(ids: Tensor, token: Tensor) -> Tensor:
    """1[y ∈ S] per position: (N, k) ids, (N,) sampled tokens → (N,) bool."""
    return (ids.long() == token.reshape(-1, 1).long()).any(-1)


# ---- the per-token KL ----------------------------------------------------------------------------------------------
def _guarded(d: Tensor) -> tuple[Tensor, Tensor]:
    """(log-ratio limited to ±guard with NaN (−inf − −inf) → 0, 1[the gradient passes])."""
    ok = torch.isfinite(d) & (d.abs() <= LOG_RATIO_GUARD)
    return torch.where(torch.isnan(d), 0.0, d).clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD), ok


def _tail_mass(log_probs_s: Tensor) -> Tensor:
    """1 − Σ_S exp(log_probs), ≥ 0 (rounding can push Σ_S above 1)."""
    return (1.0 - log_probs_s.exp().sum(-1)).clamp(min=0.0)


def _safe_log(x: Tensor) -> Tensor:
    return torch.log(x.clamp(min=torch.finfo(x.dtype).tiny))


class TopKKL(NamedTuple):
    """The analytic (+ bucket) KL per token and the detached quantities of the KL-share diagnostic."""

    kl: Tensor  # (N,) Σ_S part [+ bucket tail], with gradient through the logits; 0 on padding
    log_p_s: Tensor  # (N, k) detached log p at S
    log_q_s: Tensor  # (N, k) detached log q at S (sanitised)
    log_z: Tensor  # (N,) detached log-sum-exp of the logits
    sum_sq: Tensor  # (N,) detached Σ_V p² (empty unless asked for)
    direction: str
    tail: str
    has_tail: bool  # k < V (with S = V there is no tail)


def topk_kl(
    logits: Tensor,
    support: Support,
    direction: str,
    tail: str,
    mask: Optional[Tensor] = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    with_sum_sq: bool = False,
) -> TopKKL:
    """Per token: Σ_S p·log(p/q) (reverse) or Σ_S q·log(q/p) (forward), plus the bucket tail when tail='bucket'
    (the sampled tail is `sampled_tail`). logits (N, V) current, with gradient; support (N, k) from the old-log-prob
    or reference pass; mask (N,) bool. The analytic part at S = V is the exact KL of the position."""
    check_options(direction, tail)
    n, vocab = logits.shape
    k = check_k(support.ids.shape[-1], vocab, "support width k")
    valid = _valid(logits, mask)
    log_z, z_s, sum_sq = _logsumexp_and_gather(logits, support.ids, valid, chunk_tokens, with_sum_sq)
    log_p_s = z_s - log_z[:, None]
    log_q_s = torch.where(valid[:, None], support.log_probs.to(log_z.dtype), 0.0).detach()
    p_s, q_s = log_p_s.exp(), log_q_s.exp()
    if direction == "reverse":
        ratio, _ = _guarded(log_p_s - log_q_s)
        kl = (p_s * ratio).sum(-1)
    else:
        ratio, _ = _guarded(log_q_s - log_p_s)
        kl = (q_s * ratio).sum(-1)
    if modes.topk_tail(tail).in_logits and k < vocab:
        p_t, q_t = _tail_mass(log_p_s), _tail_mass(log_q_s)
        if direction == "reverse":
            kl = kl + p_t * _guarded(_safe_log(p_t) - _safe_log(q_t))[0]
        else:
            kl = kl + q_t * _guarded(_safe_log(q_t) - _safe_log(p_t))[0]
    kl = torch.where(valid, kl, 0.0)
    return TopKKL(kl, log_p_s.detach(), log_q_s, log_z.detach(), sum_sq, direction, tail, k < vocab)


def sampled_tail(
    log_prob: Tensor,
    old_log_prob: Tensor,
    ref_log_prob: Optional[Tensor],
    token_in_support: Tensor,
    mask: Tensor,
    direction: str,
) -> Tensor:
    """1[y∈T]·w·log(p_y/q_y) (reverse) or 1[y∈T]·ρ·log(q_y/p_y) (forward) per token, any shape; gradient through
    `log_prob` (log p_y); `ref_log_prob` None for the iterative reference (q = μ, ρ = 1). Unbiased in value and
    gradient for the tail's part of the KL on μ samples (docs/losses.md#topk-kl). 0 on masked tokens and y ∈ S."""
    check_options(direction, "sampled")
    tail = mask.bool() & ~token_in_support.bool()
    log_w = guarded_log_ratio(log_prob, old_log_prob.detach(), tail)
    log_rho = 0.0 if ref_log_prob is None else guarded_log_ratio(ref_log_prob.detach(), old_log_prob.detach(), tail)
    if direction == "reverse":
        out = torch.exp(log_w) * (log_w - log_rho)
    else:
        rho = 1.0 if ref_log_prob is None else torch.exp(log_rho)
        out = rho * (log_rho - log_w)
    return torch.where(tail, out, 0.0)


def sequence_credited(
    kl: Tensor, log_w: Tensor, log_rho: Tensor | float, mask: Tensor, beta: float, direction: str
) -> Tensor:
    """β·K with sequence credit (docs/losses.md#topk-kl, #kl-credit), per token (bs, T): reverse
    β·SG(P_t)·K_t + β·SG(G_t)·(log w_t − SG(log w_t)) with G_t = Σ_{t'>t} P_{t'}·SG(K_{t'}); forward β·SG(R_t)·K_t.
    `kl` the per-token top-k KL (analytic + tail, with gradient), `log_w` guarded with gradient, `log_rho` detached."""
    mask = mask.bool()
    with torch.no_grad():
        if direction == "forward":
            log_rho = torch.as_tensor(log_rho, dtype=torch.float64, device=kl.device)
            lr = torch.where(mask, log_rho.double(), 0.0)
            hist = exclusive_prefix_sum(lr).clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD).exp()
        else:
            lw = torch.where(mask, log_w.detach().double(), 0.0)
            hist = exclusive_prefix_sum(lw).clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD).exp()
            future = exclusive_suffix_sum(hist * torch.where(mask, kl.detach().double(), 0.0)) * beta
    out = beta * hist.to(kl.dtype) * kl
    if direction == "reverse":  # value 0, gradient β·G_t·∇log π_θ(y_t|h_t)
        out = out + future.to(kl.dtype) * (log_w - log_w.detach())
    return torch.where(mask, out, 0.0)


# ---- the KL-share diagnostic (closed form, no second backward) -----------------------------------------------------
class KLShare(NamedTuple):
    kl_grad_norm: Tensor  # (N,) β·‖∇_z K‖ (analytic + tail of this token)
    adv_grad_norm: Tensor  # (N,) |A|·‖e_y − p‖
    # rows with mask False are 0 in both


class ShareMoments(NamedTuple):
    """Per token, float64, from the forward's values at the support (a_v = ∂K/∂log p_v, the bucket included): what
    the KL share needs from the logits, so that the engine can hand it to the loss as per-token scalars."""

    sum_a: Tensor  # Σ_S a_v
    sum_aa: Tensor  # Σ_S a_v²
    sum_ap: Tensor  # Σ_S a_v·p_v
    sum_pp: Tensor  # Σ_S p_v²
    sum_sq: Tensor  # Σ_V p_v²


@torch.no_grad()
def share_moments(terms: TopKKL) -> ShareMoments:
    """The `ShareMoments` of `terms` (from `topk_kl(..., with_sum_sq=True)`)."""
    if terms.sum_sq.numel() != terms.kl.numel():
        raise ValueError("kl_share needs topk_kl(..., with_sum_sq=True)")
    f64 = torch.float64
    lp, lq = terms.log_p_s.to(f64), terms.log_q_s.to(f64)
    p, q = lp.exp(), lq.exp()
    if terms.direction == "reverse":  # a_v = ∂[p_v·log(p_v/q_v)]/∂log p_v
        ratio, ok = _guarded(lp - lq)
        a = p * (ratio + ok.to(f64))
    else:  # a_v = ∂[q_v·log(q_v/p_v)]/∂log p_v
        a = -q * _guarded(lq - lp)[1].to(f64)
    if modes.topk_tail(terms.tail).in_logits and terms.has_tail:  # d_T = dB/dp_T through p_T = 1 − Σ_S p: a_v −= d_T·p_v
        p_t_raw = 1.0 - p.sum(-1)
        p_t, q_t = p_t_raw.clamp(min=0.0), _tail_mass(lq)
        tiny = torch.finfo(f64).tiny
        log_ratio, ok_t = _guarded(_safe_log(p_t) - _safe_log(q_t))
        on = (p_t_raw >= 0).to(f64)
        live = on * (p_t >= tiny).to(f64) * ok_t.to(f64)
        if terms.direction == "reverse":
            d_t = log_ratio * on + live
        else:
            d_t = -q_t * live / p_t.clamp(min=tiny)
        a = a - d_t[:, None] * p
    return ShareMoments(a.sum(-1), (a * a).sum(-1), (a * p).sum(-1), (p * p).sum(-1), terms.sum_sq.to(f64))


@torch.no_grad()
def kl_share(terms: TopKKL, *args, **kwargs) -> KLShare:
    """Per token the logit-space gradient norms of the KL term and of the reward term, from the forward's values.

    With a_v = ∂K/∂log p_v (v ∈ S; the bucket tail enters through p_T = 1 − Σ_S p) and s the sampled tail's
    coefficient (its ∇_z is s·(e_y − p)), ∇_z K = 1[·∈S]·a + s·e_y − κ·p with κ = Σ_S a + s, hence
    ‖∇_z K‖² = Σ_S (a_v − κp_v)² + κ²·(Σ_T p² − 1[y∈T]·p_y²) + 1[y∈T]·(s − κp_y)²  and  ‖e_y − p‖² = 1 − 2p_y + Σ_V p².
    `terms` from `topk_kl(..., with_sum_sq=True)`; then, as `kl_share_from_moments` takes them after the direction
    and the tail: β, and the (N,) inputs A, log p_y, 1[y∈S], mask, and for the sampled tail log μ_y and log q_y (None:
    iterative reference). Padding rows are 0."""
    return kl_share_from_moments(share_moments(terms), terms.direction, terms.tail, *args, **kwargs)


@torch.no_grad()
def share_ratio(kl_sum: float, adv_sum: float) -> float:
    """actor/rpg/kl_share from the summed per-token norms: Σ kl / (Σ kl + Σ adv) in [0, 1] (1 where every advantage is
    0, 0 where both vanish); shared by the sampled and the top-k KL."""
    return kl_sum / (kl_sum + adv_sum) if kl_sum + adv_sum > 0 else 0.0


def kl_share_from_moments(
    m: ShareMoments,
    direction: str,
    tail: str,
    beta: float,
    advantages: Tensor,
    log_prob: Tensor,
    token_in_support: Tensor,
    mask: Tensor,
    old_log_prob: Optional[Tensor] = None,
    ref_log_prob: Optional[Tensor] = None,
) -> KLShare:
    """`kl_share` from the support's moments: Σ_S (a_v − κp_v)² = Σa² − 2κ·Σap + κ²·Σp². Any shape (flattened)."""
    f64 = torch.float64
    sum_a, sum_aa, sum_ap, sum_pp, vocab_sq = (x.reshape(-1).to(f64) for x in m)
    lpy = log_prob.reshape(-1).to(f64)
    py = lpy.exp()
    outside = ~token_in_support.reshape(-1).bool()
    s = torch.zeros_like(py)
    if modes.topk_tail(tail).in_loss:
        if old_log_prob is None:
            raise ValueError("kl_share with tail='sampled' needs old_log_prob (log μ_y) for the tail's coefficient")
        old = old_log_prob.reshape(-1).to(f64)
        d = torch.where(outside, lpy - old, 0.0)
        ok_w = (d.abs() <= LOG_RATIO_GUARD).to(f64)
        lw = d.clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)
        lr = torch.zeros_like(lw)
        if ref_log_prob is not None:
            lr = torch.where(outside, ref_log_prob.reshape(-1).to(f64) - old, 0.0)
            lr = lr.clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)
        s = ok_w * (lw.exp() * (lw - lr + 1.0) if direction == "reverse" else -lr.exp())
        s = torch.where(outside, s, 0.0)
    kappa = sum_a + s
    tail_sq = (vocab_sq - sum_pp).clamp(min=0.0)  # Σ_T p²
    tail_sq = torch.where(outside, (tail_sq - py * py).clamp(min=0.0), tail_sq)
    sq = sum_aa - 2.0 * kappa * sum_ap + kappa**2 * sum_pp + kappa**2 * tail_sq
    sq = sq + torch.where(outside, (s - kappa * py) ** 2, 0.0)
    valid = mask.reshape(-1).bool()
    kl_norm = torch.where(valid, beta * sq.clamp(min=0.0).sqrt(), 0.0)
    adv = advantages.reshape(-1).to(f64).abs() * (1.0 - 2.0 * py + vocab_sq).clamp(min=0.0).sqrt()
    return KLShare(kl_norm, torch.where(valid, adv, 0.0))
