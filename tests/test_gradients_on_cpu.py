"""Exact-enumeration gradient tests of every RPG loss against the paper's closed-form gradients (docs/losses.md#tests).

For each loss the autograd gradient of the per-token loss is compared with
  * per token:     ∇L_y = −Weight(y)·∇log π_θ(y)      (Weight from the propositions, tests/rpg_oracles.py)
  * in expectation: Σ_y π_old(y)·∇L_y = −∇J(θ)         (J written in closed form and differentiated exactly)
on a 6-way softmax policy, in float64, for the iterative reference (ρ ≡ 1), a frozen reference (ρ ≠ 1) and an EMA
reference (the parameters of a frozen one blended with the sampling policy's: ρ ≠ 1; nothing new in the losses).
Mutation tests at the end show the checks fail when a divergence entry or ρ is perturbed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import rpg.losses as L
from rpg.divergences import DIVERGENCES, Divergence
from rpg_oracles import DIVS, grad_log_pi, make_problem, per_token_grads, true_gradient, weight

BETA = 0.3  # large β so that the KL part of every check is far above float64 noise
WIDE = L.ClipParams(eps_low=0.999, eps_high=1e6, c=1e7)  # trust region containing every ratio
PAPER = L.ClipParams(eps_low=0.2, eps_high=0.28, c=10.0)
FAMILIES = ("fd", "fd_inside", "reinforce", "reinforce_raw")


def token_loss(family, div, theta, log_old, adv, beta=BETA, clip=WIDE, log_ref=None, **kw):
    """Per-token loss vector (K,) of one family for the K tokens of the categorical problem."""
    th = theta.detach().clone().requires_grad_(True)
    log_prob = torch.log_softmax(th, -1).unsqueeze(0)
    args = (log_prob, log_old.unsqueeze(0), adv.unsqueeze(0), torch.ones(1, log_old.numel(), dtype=torch.bool))
    ref = None if log_ref is None else log_ref.unsqueeze(0)
    d = DIVERGENCES[div] if isinstance(div, str) else div
    if family in ("fd", "fd_inside"):
        placement = "inside_clip" if family == "fd_inside" else "additive"
        out = L.rpg_fully_differentiable(*args, d, beta, clip, kl_placement=placement, ref_log_prob=ref, **kw)
    elif family in ("reinforce", "reinforce_raw"):
        kw.setdefault("kl_ratio", "raw" if family == "reinforce_raw" else "clipped")
        out = L.rpg_reinforce(*args, d, beta, clip, ref_log_prob=ref, **kw)
    elif family == "hardclip":
        out = L.rpg_reinforce(*args, d, beta, clip, hard_clip=True, ref_log_prob=ref, **kw)
    else:
        raise ValueError(family)
    return out.loss.squeeze(0), th, out


EMA_TAU = 0.9


def reference_log_probs(mode, log_old, log_ref):
    """π_ref of a mode: None (iterative), the problem's reference (frozen), or the EMA reference of
    docs/reference-modes.md#ema: logits τ·φ_ref + (1 − τ)·φ_old (a softmax policy's parameters are its logits)."""
    if mode == "iterative":
        return None
    return torch.log_softmax(EMA_TAU * log_ref + (1 - EMA_TAU) * log_old, -1) if mode == "ema" else log_ref


def expectation_error(family, div, seed, log_ref_mode="iterative", clip=WIDE, **kw):
    theta, log_old, log_ref, adv = make_problem(seed, spread=0.8, ref_spread=0.7)
    ref = log_ref = reference_log_probs(log_ref_mode, log_old, log_ref)
    loss, th, _ = token_loss(family, div, theta, log_old, adv, clip=clip, log_ref=ref, **kw)
    (g,) = torch.autograd.grad((log_old.exp() * loss).sum(), th)
    target = -true_gradient(div if isinstance(div, str) else div.name, theta, log_old,
                            log_old if ref is None else log_ref, adv, BETA)  # fmt: skip
    return (g - target).abs().max().item(), target.abs().max().item()


def per_token_error(family, div, seed, log_ref_mode="iterative", clip=WIDE, **kw):
    theta, log_old, log_ref, adv = make_problem(seed, spread=0.8, ref_spread=0.7)
    ref = log_ref = reference_log_probs(log_ref_mode, log_old, log_ref)
    loss, th, _ = token_loss(family, div, theta, log_old, adv, clip=clip, log_ref=ref, **kw)
    grads = per_token_grads(loss, th)
    log_w = torch.log_softmax(theta, -1) - log_old
    log_rho = None if ref is None else log_ref - log_old
    name = div if isinstance(div, str) else div.name
    expected = -weight(name, log_w, adv, BETA, log_rho).unsqueeze(1) * grad_log_pi(theta)
    return (grads - expected).abs().max().item()


# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["iterative", "frozen", "ema"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expected_gradient_equals_closed_form(div, family, mode, seed):
    """Σ_y π_old(y)·∇L_y = −∇J exactly (unclipped region), for all 4 divergences × both families × both refs."""
    err, scale = expectation_error(family, div, seed, mode)
    assert scale > 1e-2
    assert err < 1e-10, (div, family, mode, err)


@pytest.mark.parametrize("mode", ["iterative", "frozen", "ema"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("div", DIVS)
def test_per_token_gradient_equals_weight(div, family, mode):
    """∇L_y = −Weight(y)·∇log π_θ(y) for every sample y, not only in expectation
    (docs/losses.md#fully-differentiable-surrogates)."""
    assert per_token_error(family, div, 3, mode) < 1e-10


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("family", ["fd", "fd_inside", "reinforce"])
def test_paper_clips_in_trust_region_are_exact(div, family):
    """With the paper's (0.2, 0.28, c=10) and every w inside [0.8, 1.28], the clipped losses are exact too."""
    theta, log_old, _, adv = make_problem(7, spread=0.05)
    w = (torch.log_softmax(theta, -1) - log_old).exp()
    assert ((w > 0.8) & (w < 1.28)).all()
    loss, th, _ = token_loss(family, div, theta, log_old, adv, clip=PAPER)
    (g,) = torch.autograd.grad((log_old.exp() * loss).sum(), th)
    assert (g + true_gradient(div, theta, log_old, log_old, adv, BETA)).abs().max() < 1e-10


def test_u_variants_are_control_variates_of_each_other():
    """UFKL≡FKL and URKL≡RKL in expectation (E_old[w∇log π] = 0) while their per-token gradients differ by β·w·∇log π
    (docs/losses.md#control-variates) — in both families."""
    theta, log_old, _, adv = make_problem(11, spread=0.8)
    w = (torch.log_softmax(theta, -1) - log_old).exp()
    glp = grad_log_pi(theta)
    assert (log_old.exp().unsqueeze(1) * w.unsqueeze(1) * glp).sum(0).abs().max() < 1e-12
    for family in ("fd", "reinforce_raw"):
        for norm, unnorm, sign in (("fkl", "ufkl", +1.0), ("rkl", "urkl", -1.0)):
            ln, thn, _ = token_loss(family, norm, theta, log_old, adv)
            lu, thu, _ = token_loss(family, unnorm, theta, log_old, adv)
            gn, gu = per_token_grads(ln, thn), per_token_grads(lu, thu)
            # Weight_U − Weight = ∓β·w  ⇒  ∇L_U − ∇L = ±β·w·∇log π
            assert (gu - gn - sign * BETA * w.unsqueeze(1) * glp).abs().max() < 1e-12
            assert (gu - gn).abs().max() > 1e-3  # the per-token estimators really differ
            en = (log_old.exp().unsqueeze(1) * gn).sum(0)
            eu = (log_old.exp().unsqueeze(1) * gu).sum(0)
            assert (en - eu).abs().max() < 1e-12


@pytest.mark.parametrize("div", DIVS)
def test_hardclip_weight_is_truncated_is(div):
    """rpg_reinforce_hardclip: ∇L_y = −(w̄·A + β·C_KL(w̄))·∇log π_θ(y) for every token, also outside the region."""
    theta, log_old, _, adv = make_problem(5, spread=1.5)
    log_w = torch.log_softmax(theta, -1) - log_old
    w = log_w.exp()
    assert ((w < 0.8) | (w > 1.28)).any()
    loss, th, _ = token_loss("hardclip", div, theta, log_old, adv, clip=PAPER)
    w_bar = w.clamp(0.8, 1.28)
    kl_part = weight(div, w_bar.log(), torch.zeros_like(adv), BETA)  # C_KL at w̄ (the A-part vanishes)
    expected = -(w_bar * adv + kl_part).unsqueeze(1) * grad_log_pi(theta)
    assert (per_token_grads(loss, th) - expected).abs().max() < 1e-10


def test_inside_clip_differs_from_the_papers_example_advantage():
    """The paper's example Â_URKL = A − β·log w inside Algorithm 1 yields the RKL estimator (an extra +β·w·∇log π
    per sample), while our inside_clip Â = A − β(log w − 1) is the exact URKL one
    (docs/losses.md#paper-example-advantages)."""
    theta, log_old, _, adv = make_problem(2, spread=0.5)
    th = theta.clone().requires_grad_(True)
    log_w = torch.log_softmax(th, -1) - log_old
    paper_example = -(log_w.exp() * (adv - BETA * log_w))  # −w·Â with gradient through Â
    g_paper = per_token_grads(paper_example, th)
    log_w_d = log_w.detach()
    exact = -weight("urkl", log_w_d, adv, BETA).unsqueeze(1) * grad_log_pi(theta)
    assert (g_paper - exact - BETA * log_w_d.exp().unsqueeze(1) * grad_log_pi(theta)).abs().max() < 1e-12
    assert per_token_error("fd_inside", "urkl", 2) < 1e-10


# The per-token losses of the paper's Table 1 (UFKL, URKL) and Table 4 (FKL, RKL) at ρ ≡ 1, written out here
# independently of rpg.divergences (whose surrogates may differ from them by constants).
PAPER_TABLE_LOSS = {
    "fkl": lambda lw, w: -lw,
    "ufkl": lambda lw, w: w - lw - 1.0,
    "rkl": lambda lw, w: w * lw,
    "urkl": lambda lw, w: w * lw - w,
}


@pytest.mark.parametrize("div", DIVS)
def test_inside_clip_is_literal_algorithm_1_with_the_table_loss_outside_the_trust_region(div):
    """kl_placement=inside_clip is Algorithm 1 with the θ-dependent Â = A − β·T(w)/w, T the Table 1/4 loss, so that
    −w·Â = −w·A + β·T(w) unclipped: dual clip on Â (−Â·min(w, 1+ε2) if Â ≥ 0, −Â·clip(w, 1−ε1, c) if Â < 0), values
    and per-token gradients, with many ratios outside [1−ε1, 1+ε2]. A constant added to T leaves the unclipped
    gradient unchanged but changes Â, the clip branch and the clipped gradient; this test pins the constant."""
    theta, log_old, _, adv = make_problem(5, spread=1.5)
    th = theta.clone().requires_grad_(True)
    log_w = torch.log_softmax(th, -1) - log_old
    w = log_w.exp()
    assert ((w < 0.8) | (w > 1.28)).sum() >= 3
    adv_hat = adv - BETA * PAPER_TABLE_LOSS[div](log_w, w) / w
    positive = adv_hat.detach() >= 0
    expected = torch.where(positive, -adv_hat * torch.clamp(w, max=1.28), -adv_hat * torch.clamp(w, 0.8, 10.0))
    loss, th_l, _ = token_loss("fd_inside", div, theta, log_old, adv, clip=PAPER)
    assert (loss.detach() - expected.detach()).abs().max() < 1e-12
    assert (per_token_grads(loss, th_l) - per_token_grads(expected, th)).abs().max() < 1e-12


# ---------------------------------------------------------------------------------------------------------------
# mutation tests: the checks above must fail when the math is wrong
# ---------------------------------------------------------------------------------------------------------------
def _perturbed(div: Divergence, which: str) -> Divergence:
    """`div` with 0.05·w added to the factor of w in C_KL/β (`kl_w`) or in the Table loss T (`table_w`): the REINFORCE
    weight or the surrogate gains 0.05·w², which is not zero-mean."""
    base = getattr(div, which)

    def perturbed(lw, lr):
        return (0.0 if base is None else base(lw, lr)) + 0.05 * lw.exp()

    return dataclasses.replace(div, **{which: perturbed})


@pytest.mark.parametrize("div", DIVS)
def test_checks_detect_a_perturbed_reinforce_weight(div):
    bad = _perturbed(DIVERGENCES[div], "kl_w")
    assert per_token_error("reinforce_raw", bad, 3) > 1e-3
    assert expectation_error("reinforce_raw", bad, 3)[0] > 1e-4
    assert expectation_error("reinforce_raw", DIVERGENCES[div], 3)[0] < 1e-10


@pytest.mark.parametrize("family", ["fd", "fd_inside"])
@pytest.mark.parametrize("div", DIVS)
def test_checks_detect_a_perturbed_surrogate(div, family):
    bad = _perturbed(DIVERGENCES[div], "table_w")
    assert per_token_error(family, bad, 3) > 1e-3
    assert expectation_error(family, bad, 3)[0] > 1e-4


@pytest.mark.parametrize("family", ["fd", "reinforce_raw"])
@pytest.mark.parametrize("div", DIVS)
def test_checks_detect_a_dropped_rho(div, family, monkeypatch):
    """With a frozen reference, computing the KL as if ρ ≡ 1 (the authors' mistake in spirit,
    docs/differences.md#d10) is caught."""
    assert expectation_error(family, div, 4, "frozen")[0] < 1e-10
    monkeypatch.setattr(L, "reference_ratio", lambda old, ref, mask: (0.0, 1.0))
    assert expectation_error(family, div, 4, "frozen")[0] > 1e-4
