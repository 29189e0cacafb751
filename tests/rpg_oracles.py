"""Independent oracles for the RPG math tests (exact enumeration on a small categorical policy, docs/losses.md#tests).

Nothing here imports the divergence table: the objectives J(θ) and the per-sample REINFORCE weights are written
from the paper's propositions directly, so a wrong entry in `rpg.divergences` cannot agree with them by construction.

Setting: one "history", a categorical policy π_θ = softmax(θ) over K tokens, a sampling policy π_old and a KL
reference π_ref (π_ref = π_old for the iterative reference). Every token y is one item; its probability under the
sampler is π_old(y). The expected loss is Σ_y π_old(y)·L_y, exactly (no Monte Carlo).
"""

from __future__ import annotations

import torch

K = 6
DIVS = ("fkl", "rkl", "ufkl", "urkl")


def objective(div: str, theta: torch.Tensor, log_old: torch.Tensor, log_ref: torch.Tensor, adv: torch.Tensor):
    """J(θ) = E_{π_θ}[A] − β·D for β = 1 (scaled by the caller). Paper eqs. E.1, E.2, 3.1, 3.3."""
    log_p = torch.log_softmax(theta, -1)
    p, ref = log_p.exp(), log_ref.exp()
    reward = (p * adv).sum()
    if div == "fkl":
        d = (ref * (log_ref - log_p)).sum()
    elif div == "ufkl":
        d = (ref * (log_ref - log_p)).sum() + (p - ref).sum()
    elif div == "rkl":
        d = (p * (log_p - log_ref)).sum()
    elif div == "urkl":
        d = (p * (log_p - log_ref)).sum() + (ref - p).sum()
    else:
        raise ValueError(div)
    return reward, d


def true_gradient(div, theta, log_old, log_ref, adv, beta):
    """∇_θ J = ∇E_θ[A] − β∇D, by autograd on the closed-form objective."""
    th = theta.detach().clone().requires_grad_(True)
    reward, d = objective(div, th, log_old, log_ref, adv)
    (g,) = torch.autograd.grad(reward - beta * d, th)
    return g


def weight(div, log_w, adv, beta, log_rho=None):
    """Per-sample REINFORCE weight (gradient of J = E_old[Weight·∇log π_θ]), Props. E.1, 3.2, E.3, 3.6 with A for R,
    generalised to a reference π_ref with ρ = π_ref/π_old (docs/losses.md#rho-weighting)."""
    w = log_w.exp()
    log_rho = torch.zeros_like(log_w) if log_rho is None else log_rho
    rho = log_rho.exp()
    if div == "fkl":
        return w * adv + beta * rho
    if div == "ufkl":
        return w * adv - beta * (w - rho)
    if div == "rkl":
        return w * (adv - beta * (log_w - log_rho + 1.0))
    if div == "urkl":
        return w * (adv - beta * (log_w - log_rho))
    raise ValueError(div)


def per_token_grads(loss_vec: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """(K, K) matrix whose row y is ∇_θ L_y."""
    rows = [torch.autograd.grad(loss_vec[y], theta, retain_graph=True)[0] for y in range(loss_vec.numel())]
    return torch.stack(rows)


def grad_log_pi(theta: torch.Tensor) -> torch.Tensor:
    """(K, K) matrix whose row y is ∇_θ log π_θ(y) = e_y − π_θ."""
    p = torch.softmax(theta.detach(), -1)
    return torch.eye(theta.numel(), dtype=theta.dtype) - p.unsqueeze(0)


def make_problem(seed: int, spread: float = 0.1, ref_spread: float = 0.0):
    """θ, log π_old (θ + noise·spread), log π_ref (θ_old + noise·ref_spread, or = old), advantages A = R − b."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(K, generator=g, dtype=torch.float64)
    log_old = torch.log_softmax(theta + spread * torch.randn(K, generator=g, dtype=torch.float64), -1)
    log_ref = torch.log_softmax(log_old + ref_spread * torch.randn(K, generator=g, dtype=torch.float64), -1)
    reward = torch.randn(K, generator=g, dtype=torch.float64)
    adv = reward - 0.3  # any constant baseline keeps the gradient unbiased
    return theta, log_old, log_ref, adv
