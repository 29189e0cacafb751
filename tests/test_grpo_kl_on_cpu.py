"""GRPO's KL estimator vs the importance-weighted correction `grpo_wk3` (paper §2.2; docs/losses.md#grpo-kl, #tests).

Exact enumeration on a 6-way softmax, float64, advantages 0 so that only the KL term is tested.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import kl_penalty

import rpg.losses as L
from rpg.divergences import DIVERGENCES
from rpg_oracles import make_problem

WIDE = L.ClipParams(0.999, 1e6, 1e7)


def kl_grad(theta, log_ref, forward: bool):
    """∇_θ KL(π_ref‖π_θ) (forward=True) or ∇_θ KL(π_θ‖π_ref), closed form + autograd."""
    th = theta.clone().requires_grad_(True)
    log_p = torch.log_softmax(th, -1)
    if forward:
        kl = (log_ref.exp() * (log_ref - log_p)).sum()
    else:
        kl = (log_p.exp() * (log_p - log_ref)).sum()
    return torch.autograd.grad(kl, th)[0]


def expected_grad(per_token, theta, log_old):
    th = theta.clone().requires_grad_(True)
    log_p = torch.log_softmax(th, -1)
    values = per_token(log_p)
    return torch.autograd.grad((log_old.exp() * values).sum(), th)[0]


def unweighted_k3(log_ref):
    """GRPO's term: verl's own `low_var_kl` (k3 of π_ref/π_θ, no importance weight)."""
    return lambda log_p: kl_penalty(log_p, log_ref, "low_var_kl")


def weighted_k3(log_old, log_ref):
    """`grpo_wk3`'s term: the URKL surrogate with ρ = π_ref/π_old, i.e. w·k3(π_ref/π_θ)."""

    def f(log_p):
        out = L.rpg_fully_differentiable(
            log_p.unsqueeze(0), log_old.unsqueeze(0), torch.zeros(1, log_p.numel(), dtype=log_p.dtype),
            torch.ones(1, log_p.numel(), dtype=torch.bool), DIVERGENCES["urkl"], 1.0, WIDE,
            ref_log_prob=log_ref.unsqueeze(0),
        )  # fmt: skip
        return out.loss.squeeze(0)

    return f


def test_unweighted_k3_off_policy_is_not_the_reverse_kl_gradient():
    theta, log_old, log_ref, _ = make_problem(0, spread=0.7, ref_spread=0.8)
    g = expected_grad(unweighted_k3(log_ref), theta, log_old)
    assert (g - kl_grad(theta, log_ref, forward=False)).abs().max() > 1e-3


def test_unweighted_k3_on_policy_descends_the_forward_kl():
    theta, _, log_ref, _ = make_problem(1, spread=0.0, ref_spread=0.8)
    log_on = torch.log_softmax(theta, -1)  # π_old = π_θ
    g = expected_grad(unweighted_k3(log_ref), theta, log_on)
    assert (g - kl_grad(theta, log_ref, forward=True)).abs().max() < 1e-12
    assert (g - kl_grad(theta, log_ref, forward=False)).abs().max() > 1e-3


def test_weighted_k3_is_the_exact_reverse_kl_gradient_off_policy():
    for seed in range(4):
        theta, log_old, log_ref, _ = make_problem(seed, spread=0.7, ref_spread=0.8)
        g = expected_grad(weighted_k3(log_old, log_ref), theta, log_old)
        assert (g - kl_grad(theta, log_ref, forward=False)).abs().max() < 1e-12


def test_weighted_k3_with_ref_equal_old_is_the_rpg_urkl_term():
    """w·k3(1/w) ≡ w·log w − w + 1: GRPO-corrected with the iterative reference is RPG-URKL's regulariser."""
    log_w = torch.linspace(-5, 5, 101, dtype=torch.float64)
    w = log_w.exp()
    k3 = (1 / w) - torch.log(1 / w) - 1
    assert torch.allclose(w * k3, w * log_w - w + 1, atol=1e-12)
    assert torch.allclose(w * k3, DIVERGENCES["urkl"].surrogate(log_w, w, 0.0, 1.0), atol=1e-12)
