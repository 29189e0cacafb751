"""Numerics up to the log-ratio guard (docs/losses.md#numerics), for every registered loss and every option value.

On a grid of log w and log ρ reaching LOG_RATIO_GUARD = 60 (both signs of A, float32 and float64), through the
registered verl function (`token-sum`, so that the gradient with respect to each token's log-prob is that token's
own gradient):

* the loss value, every per-token gradient and every metric are finite;
* every per-token gradient equals the closed-form gradient written below with Python's math (float64, log space),
  within a few units of rounding of its terms, wherever that gradient is representable with the promised headroom
  (its terms below finfo(dtype).max·1e-9; beyond that, e.g. β·ρ/w ≈ e^120 in float32, only finiteness is promised).

The closed forms are the paper's, written independently of rpg.divergences (ℓ = log w, lρ = log ρ, e = ρ/w; per-token
gradient ∂L/∂log π_θ):

* fully differentiable, `additive`: `−A·w·[gradient branch] + β·D'·[not clamped]`, D' = dD̂/dℓ:
  FKL −ρ, UFKL w − ρ, RKL w(ℓ − lρ + 1), URKL w(ℓ − lρ);
* fully differentiable, `inside_clip` (Â = A − β·G, G = T/w, T the Table 1/4 loss): `β·G'·r̄ − Â·w·[gradient
  branch]`, with r̄ the dual-clip ratio of the branch and G, G' = dG/dℓ: FKL −ℓe, −e(1 − ℓ); UFKL 1 − e(1 + ℓ − lρ),
  e(ℓ − lρ); RKL ℓ − lρ, 1; URKL ℓ − lρ − 1, 1; where |T| > kl_clamp: ±kl_clamp/w, ∓kl_clamp/w;
* REINFORCE (Algorithm 2) and hard clip: `−(C + r̄·A)·[gradient branch]`, `C = β·C_KL(w_k)` with w_k = w̄ or w:
  FKL βρ, UFKL β(ρ − w_k), RKL −βw_k(log w_k − lρ + 1), URKL −βw_k(log w_k − lρ); the branch sign is A' = A + C/w
  (or A).

The old code failed here: `inside_clip` lost URKL's KL term where w ≪ ρ (the gradient off by 0.3–14% in float32 from
|log(w/ρ)| ≈ 11–19) and gave −inf gradients for FKL/UFKL in float32 from log w ≈ −44 (autograd's T/w² overflowed).
About 20 s.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.workers.config import ActorConfig

import rpg.losses as L
from rpg.divergences import DIVERGENCES
from rpg.loss_config import RPGPolicyLossConfig

pytestmark = pytest.mark.usefixtures("ref_log_prob_adapter")  # losses with a reference, in-process

GRID = [-60.0, -50.0, -44.0, -30.0, -19.0, -11.0, -1.0, 0.0, 1.0, 11.0, 19.0, 30.0, 44.0, 50.0, 60.0]
ADVANTAGES = [0.5, -0.5]
BETA = 0.05
EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 10.0
OLD = -70.0  # log π_old of every token: log π_θ = OLD + ℓ and log π_ref = OLD + lρ are exact integers
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-12}  # relative to the sum of |terms| of the gradient
HEADROOM = 1e-9  # exactness is promised below finfo(dtype).max·HEADROOM


def option_sets(spec):
    """Every combination of the option values that act on this loss (the others are refused by the config)."""
    choices = {
        "kl_placement": ["additive", "inside_clip"],
        "kl_clamp": [None, 10.0],
        "branch_on": ["effective_advantage", "advantage"],
        "kl_ratio": ["clipped", "raw"],
    }
    names = [o for o in spec.options if o in choices]
    for values in itertools.product(*(choices[n] for n in names)):
        yield dict(zip(names, values))


CASES = [
    pytest.param(name, options, reference, dtype,
                 id=f"{name}-{'-'.join(str(v) for v in options.values()) or 'plain'}-{reference}-{str(dtype)[6:]}")
    for name, spec in sorted(L.LOSSES.items())
    if spec.family != L.ADDON  # the add-on's numerics: tests/test_kl_addon_on_cpu.py
    for options in option_sets(spec)
    for reference in ("iterative", "frozen")
    for dtype in (torch.float32, torch.float64)
]  # fmt: skip


# ---- closed forms (Python floats, float64) ------------------------------------------------------------------------
def dual_clip(w, positive):
    """(r̄, gradient branch?) of the dual clip."""
    if positive:
        return (w, True) if w < 1.0 + EPS_HIGH else (1.0 + EPS_HIGH, False)
    if w <= 1.0 - EPS_LOW:
        return 1.0 - EPS_LOW, False
    return (w, True) if w < C else (C, False)


def table_loss(div, lw, lr):
    """T(w, ρ): the Table 1/4 loss (URKL without the surrogate's constant ρ)."""
    w, rho = math.exp(lw), math.exp(lr)
    return {"fkl": -rho * lw, "ufkl": w - rho - rho * (lw - lr), "rkl": w * (lw - lr), "urkl": w * (lw - lr) - w}[div]


def surrogate(div, lw, lr):
    return table_loss(div, lw, lr) + (math.exp(lr) if div == "urkl" else 0.0)


def kl_weight(div, lwk, lr):
    """(C_KL/β at w_k, list of its terms)."""
    wk, rho = math.exp(lwk), math.exp(lr)
    terms = {"fkl": [rho], "ufkl": [rho, -wk], "rkl": [-wk * (lwk - lr), -wk], "urkl": [-wk * (lwk - lr)]}[div]
    return sum(terms), terms


def expected(name, options, lw, lr, a):
    """(exact per-token gradient, sum of |terms|, ambiguous?) of loss `name` at ℓ = lw, lρ = lr, A = a."""
    spec = L.LOSSES[name]
    div, family = spec.divergence.name, spec.family
    w, rho = math.exp(lw), math.exp(lr)
    clamp = options.get("kl_clamp") if div != "fkl" else None
    if family == "fd" and options.get("kl_placement", "additive") == "additive":
        r, grad_branch = dual_clip(w, a >= 0)
        d_prime = {"fkl": [-rho], "ufkl": [w, -rho], "rkl": [w * (lw - lr), w], "urkl": [w * (lw - lr)]}[div]
        clamped = clamp is not None and abs(surrogate(div, lw, lr)) > clamp
        terms = [-a * w * grad_branch] + ([] if clamped else [BETA * t for t in d_prime])
        near_clamp = clamp is not None and abs(abs(surrogate(div, lw, lr)) - clamp) < 1e-3 * clamp
        return sum(terms), sum(abs(t) for t in terms), near_clamp
    if family == "fd":  # inside_clip
        e = math.exp(lr - lw)
        t = table_loss(div, lw, lr)
        if clamp is not None and abs(t) > clamp:
            g, g_prime = [math.copysign(clamp, t) / w], [-math.copysign(clamp, t) / w]
        else:
            g, g_prime = {
                "fkl": ([-lw * e], [-e, lw * e]),
                "ufkl": ([1.0, -e * (1.0 + lw - lr)], [e * (1.0 + lw - lr), -e]),
                "rkl": ([lw - lr], [1.0]),
                "urkl": ([lw - lr - 1.0], [1.0]),
            }[div]
        adv_hat = a - BETA * sum(g)
        r, grad_branch = dual_clip(w, adv_hat >= 0)
        terms = [BETA * gp * r for gp in g_prime] + ([-a * w, *(BETA * gi * w for gi in g)] if grad_branch else [])
        scale_hat = abs(a) + BETA * sum(abs(gi) for gi in g)
        ambiguous = abs(adv_hat) < 1e-4 * scale_hat or (clamp is not None and abs(abs(t) - clamp) < 1e-3 * clamp)
        return sum(terms), sum(abs(x) for x in terms), ambiguous
    w_bar = min(max(w, 1.0 - EPS_LOW), 1.0 + EPS_HIGH)
    lwk = math.log(w_bar) if options.get("kl_ratio", "clipped") == "clipped" else lw
    c, c_terms = kl_weight(div, lwk, lr)
    a_eff = a + BETA * c / w
    if family == "hardclip":
        terms = [-BETA * x for x in c_terms] + [-w_bar * a]
        return sum(terms), sum(abs(x) for x in terms), False
    positive = a_eff >= 0 if options.get("branch_on", "effective_advantage") == "effective_advantage" else a > 0
    r, grad_branch = dual_clip(w, positive)
    terms = [-BETA * x for x in c_terms] + [-r * a] if grad_branch else [0.0]
    ambiguous = abs(a_eff) < 1e-4 * (abs(a) + BETA * sum(abs(x) for x in c_terms) / w)
    return sum(terms), sum(abs(x) for x in terms), ambiguous


# ---- the test -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, options, reference, dtype", CASES)
def test_finite_and_exact_up_to_the_guard(name, options, reference, dtype, monkeypatch):
    import rpg.reference.adapter

    assert L.LOG_RATIO_GUARD == 60.0 and max(GRID) == L.LOG_RATIO_GUARD
    log_rhos = GRID if reference == "frozen" else [0.0]
    points = [(lw, lr, a) for a in ADVANTAGES for lr in log_rhos for lw in GRID]
    lw_t = torch.tensor([[p[0] for p in points]], dtype=torch.float64)
    lr_t = torch.tensor([[p[1] for p in points]], dtype=torch.float64)
    old = torch.full_like(lw_t, OLD).to(dtype)
    log_prob = (OLD + lw_t).to(dtype).requires_grad_(True)
    adv = torch.tensor([[p[2] for p in points]], dtype=dtype)
    mask = torch.ones_like(old, dtype=torch.bool)
    ref = (OLD + lr_t).to(dtype)
    needs_ref = reference == "frozen" or L.LOSSES[name].needs_reference
    monkeypatch.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: ref if needs_ref else None)
    settings = RPGPolicyLossConfig(loss_mode=name, kl_coef=BETA, **options,
                                   **({"reference": "frozen"} if reference == "frozen" else {}))  # fmt: skip
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio_low=EPS_LOW,
                      clip_ratio_high=EPS_HIGH, clip_ratio_c=C, policy_loss=settings)  # fmt: skip

    loss, metrics = POLICY_LOSS_REGISTRY[name](old, log_prob, adv, mask, "token-sum", cfg, None)
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert torch.isfinite(loss), loss
    bad = [points[j] for j in (~torch.isfinite(grad[0])).nonzero().flatten().tolist()]
    assert not bad, f"non-finite gradients at (log w, log ρ, A) = {bad[:8]}"
    assert all(math.isfinite(v) for v in metrics.values()), metrics

    representable = torch.finfo(dtype).max * HEADROOM
    wrong = []
    for j, (lw, lr, a) in enumerate(points):
        exact, scale, ambiguous = expected(name, options, lw, lr, a)
        if ambiguous or scale > representable:
            continue
        got = grad[0, j].item()
        if abs(got - exact) > TOLERANCE[dtype] * max(scale, 1e-30):
            wrong.append((lw, lr, a, got, exact))
    assert not wrong, f"{len(wrong)} inexact gradients (log w, log ρ, A, got, exact): {wrong[:6]}"


@pytest.mark.parametrize("div", sorted(DIVERGENCES))
def test_kl_adv_is_chosen_by_its_arguments_not_by_tensor_identity(div):
    """`Divergence.kl_adv` evaluates C_KL where its `log_w_kl` argument says (None: at the raw w), whichever tensor
    object carries the values: a copy of the ratio gives the same bits, and each choice equals β·C_KL(w_k)/w of the
    closed form above. The old code chose its formula by `log_w_kl is not log_w`, so a `.clone()` of log w changed
    FKL's and UFKL's float32 results."""
    d = DIVERGENCES[div]
    torch.manual_seed(0)
    log_w = torch.cat([torch.tensor(GRID), torch.empty(256).uniform_(-60.0, 60.0)])
    w = log_w.exp()
    log_w_bar = log_w.clamp(math.log(1.0 - EPS_LOW), math.log(1.0 + EPS_HIGH))
    for at in (log_w, log_w_bar):
        same = d.kl_adv(log_w, 0.0, BETA, log_w_kl=at, w=w)
        assert torch.equal(same, d.kl_adv(log_w, 0.0, BETA, log_w_kl=at.clone(), w=w))
    for at in (None, log_w, log_w_bar):
        got = d.kl_adv(log_w, 0.0, BETA, log_w_kl=at, w=w)
        for j, lw in enumerate(log_w.tolist()):
            value, terms = kl_weight(div, lw if at is None else at[j].item(), 0.0)
            scale = BETA * sum(abs(t) for t in terms) / math.exp(lw)
            assert abs(got[j].item() - BETA * value / math.exp(lw)) <= TOLERANCE[torch.float32] * scale, (at, lw)


SEQUENCE_CREDIT = [n for n, s in sorted(L.LOSSES.items()) if s.family != L.ADDON and "kl_credit" in s.options]


@pytest.mark.parametrize("kl_ratio", ["clipped", "raw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", SEQUENCE_CREDIT)
def test_sequence_credit_is_finite_at_the_guard(name, dtype, kl_ratio, monkeypatch):
    """`kl_credit=sequence` over responses whose log w reach ±60 (the guard) in either order: the loss, every gradient
    and every metric finite, `kl_adv` (C/w, which the branch and `actor/rpg/kl_adv_abs` read) included. The old code
    divided the credited C by w (≈ e^-60) without saturation: −inf in `kl_adv` and an infinite `kl_adv_abs` for the
    reverse rows with `kl_ratio=raw` (found by benchmarks/gpu_loss_check.py). Forward rows need a frozen reference
    (iterative: refused, the credit is the token one); its log ρ reach ±60 too."""
    import rpg.reference.adapter

    rows = [GRID, GRID[::-1], [30.0, -30.0, 60.0, -60.0, 60.0, -60.0, 0.5, -0.5, 0.0, 1.0, -1.0, 2.0, -2.0, 0.1, 0.2]]
    lw = torch.tensor(rows, dtype=torch.float64)
    old = torch.full_like(lw, -3.0).to(dtype)
    log_prob = (old.double() + lw).to(dtype).requires_grad_(True)
    adv = torch.tensor([[0.5], [-0.5], [1.0]], dtype=dtype).expand_as(old)
    mask = torch.ones_like(old, dtype=torch.bool)
    frozen = not L.LOSSES[name].divergence.reverse
    ref = (old.double() - lw.flip(0)).to(dtype)
    monkeypatch.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: ref if frozen else None)
    settings = RPGPolicyLossConfig(loss_mode=name, kl_coef=BETA, kl_credit="sequence",
                                   **({"reference": "frozen"} if frozen else {}),
                                   **({"kl_ratio": kl_ratio} if "kl_ratio" in L.LOSSES[name].options else {}))  # fmt: skip
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio_low=EPS_LOW,
                      clip_ratio_high=EPS_HIGH, clip_ratio_c=C, policy_loss=settings)  # fmt: skip
    loss, metrics = POLICY_LOSS_REGISTRY[name](old, log_prob, adv, mask, "token-sum", cfg, None)
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert torch.isfinite(loss) and torch.isfinite(grad).all(), (loss, grad)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
