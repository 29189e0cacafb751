"""Exact-enumeration helpers for the three-policy tests (docs/async.md#tests): samples from a rollout policy μ, the
proximal anchor π_old, the trained π_θ and a KL reference π_ref, all distinct softmax policies.

Every registered RPG loss is called through verl's policy-loss registry (`POLICY_LOSS_REGISTRY[name]`, the
`PolicyLossFn` verl's `ppo_loss` calls) with one response per row and `loss_agg_mode="token-sum"`, so the scalar it
returns is `Σ_rows Σ_t v_t·L_t` with `v` the `rollout_is_weights` it was given. The expectation over the sampler is then
exact: the gradient of each row is weighted by that row's probability under the sampler (no Monte Carlo).

Two problems:
* one step (`one_step`): a single history, `K` tokens; every token is one item, its probability under the sampler is
  μ(y). The target is −∇J(θ) with `J = E_{π_θ}[A] − β·D(π_θ, π_ref)` in closed form (`rpg_oracles.true_gradient`).
* two steps (`TwoStep`): responses `(y1, y2)` over a `K2`-token vocabulary, one softmax per history (the root and
  each `y1`), the sequence advantage broadcast over both tokens, as verl does. Used to compare verl's token-level and
  sequence-level importance weights on histories.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional
from unittest import mock

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
from verl.workers.config import ActorConfig

import rpg.losses as L
import rpg.reference.adapter
from rpg.loss_config import RPGPolicyLossConfig
from rpg_oracles import K, grad_log_pi

BETA = 0.3  # large β so that the KL part of every check is far above float64 noise
WIDE = (0.999, 1e6, 1e7)  # (ε1, ε2, c): a trust region containing every ratio of these problems (no clip active)
UNTRUNCATED = 1e9  # rollout_is_threshold above every importance ratio here: exact importance sampling
NAMES = sorted(L.LOSSES)


def actor_config(name: str, reference: str = "iterative", clip=WIDE) -> ActorConfig:
    """verl's actor config carrying the RPG settings of loss `name` (β = BETA)."""
    low, high, c = clip
    return ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio_low=low, clip_ratio_high=high,
        clip_ratio_c=c, policy_loss=RPGPolicyLossConfig(loss_mode=name, kl_coef=BETA, reference=reference),
    )  # fmt: skip


def tis_weights(log_old: torch.Tensor, log_mu: torch.Tensor, mask: torch.Tensor, level: str = "token",
                threshold: float = UNTRUNCATED) -> torch.Tensor:
    """verl's rollout-correction weights (decoupled mode): `π_old/μ` per token (`level="token"`) or its product over
    the response (`"sequence"`), truncated at `threshold` (TIS). Shapes (bs, T)."""
    weights, _ = compute_rollout_correction_weights(
        log_ratio=log_old - log_mu, response_mask=mask.to(log_old.dtype), rollout_is=level,
        rollout_is_threshold=threshold,
    )  # fmt: skip
    return weights


@contextmanager
def shipped_ref_log_prob(ref: Optional[torch.Tensor]):
    """Make `ref` the `ref_log_prob` verl ships to the loss (what `rpg.reference`'s adapter provides in a run)."""
    with mock.patch.object(rpg.reference.adapter, "current_ref_log_prob", lambda: ref):
        yield


def row_grads(name: str, cfg: ActorConfig, log_prob: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
              mask: torch.Tensor, weights: Optional[torch.Tensor], ref: Optional[torch.Tensor]) -> torch.Tensor:
    """∂(token-sum loss)/∂log_prob, (bs, T): entry (i, t) is `v_t·∂L_t/∂log π_θ(y_t|h_t)` of response i."""
    lp = log_prob.detach().clone().requires_grad_(True)
    with shipped_ref_log_prob(ref):
        loss, _ = POLICY_LOSS_REGISTRY[name](old, lp, adv, mask, "token-sum", cfg, weights)
    (g,) = torch.autograd.grad(loss, lp)
    return g


# ---- one step --------------------------------------------------------------------------------------------------
def one_step(seed: int, spread: float = 0.5, mu_spread: float = 0.9, ref_spread: float = 0.7):
    """θ, log π_old, log μ, log π_ref (each a perturbation of the previous one's logits), advantages (K,)."""
    g = torch.Generator().manual_seed(1000 + seed)

    def noise():
        return torch.randn(K, generator=g, dtype=torch.float64)

    theta = noise()
    log_old = torch.log_softmax(theta + spread * noise(), -1)
    log_mu = torch.log_softmax(log_old + mu_spread * noise(), -1)
    log_ref = torch.log_softmax(log_old + ref_spread * noise(), -1)
    adv = noise() - 0.3
    return theta, log_old, log_mu, log_ref, adv


def one_step_item_grads(name: str, theta, old_row, adv, cfg, weights=None, ref_row=None) -> torch.Tensor:
    """(K, K) matrix whose row y is `v_y·∇_θ L_y` for the K one-token responses (`old_row`, `ref_row`: (K,))."""
    log_prob = torch.log_softmax(theta, -1).unsqueeze(1)
    mask = torch.ones(K, 1, dtype=torch.bool)
    w = None if weights is None else weights.reshape(K, 1)
    ref = None if ref_row is None else ref_row.unsqueeze(1)
    g = row_grads(name, cfg, log_prob, old_row.unsqueeze(1), adv.unsqueeze(1), mask, w, ref)
    return g.reshape(K, 1) * grad_log_pi(theta)  # ∇L_y = ∂L_y/∂log π(y) · ∇log π(y)


def one_step_expected_gradient(name, theta, old_row, adv, cfg, sampler_log_prob, weights=None, ref_row=None):
    """Σ_y sampler(y)·v_y·∇_θ L_y: the exact expected gradient of the loss on samples from the sampler."""
    grads = one_step_item_grads(name, theta, old_row, adv, cfg, weights, ref_row)
    return sampler_log_prob.exp() @ grads


# ---- two steps -------------------------------------------------------------------------------------------------
K2 = 3  # vocabulary of the two-step problem: K2 first tokens, K2·K2 responses


class TwoStep:
    """Responses (y1, y2), y1 ~ p(·|root), y2 ~ p(·|y1); a policy is a (1 + K2, K2) logit table (row 0: the root,
    row 1 + y1: after y1). Rows of every batch tensor enumerate the K2² responses in the order (y1, y2)."""

    def __init__(self, seed: int, spread: float = 0.4, mu_spread: float = 0.9, ref_spread: float = 0.6):
        g = torch.Generator().manual_seed(2000 + seed)

        def noise():
            return torch.randn(1 + K2, K2, generator=g, dtype=torch.float64)

        self.theta = noise()
        self.old = self.theta + spread * noise()
        self.mu = self.old + mu_spread * noise()
        self.ref = self.old + ref_spread * noise()
        self.adv = (torch.randn(K2 * K2, generator=g, dtype=torch.float64) - 0.2).unsqueeze(1).expand(-1, 2).clone()
        y1 = torch.arange(K2).repeat_interleave(K2)
        y2 = torch.arange(K2).repeat(K2)
        self.history = torch.stack([torch.zeros_like(y1), 1 + y1], 1)  # logit row of each token's history
        self.token = torch.stack([y1, y2], 1)
        self.mask = torch.ones(K2 * K2, 2, dtype=torch.bool)

    def token_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(K2², 2): log p(y_t | h_t) of every token of every response."""
        return torch.log_softmax(logits, -1)[self.history, self.token]

    def sequence_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(K2²,): probability of each whole response."""
        return self.token_log_probs(logits).sum(1).exp()

    def expected_gradient(self, name: str, cfg, old_logits, sampler_logits, weights=None, ref_logits=None):
        """Σ_responses sampler(y1, y2)·∇_θ Σ_t v_t·L_t, exactly; (1 + K2, K2) like θ."""
        th = self.theta.clone().requires_grad_(True)
        log_prob = self.token_log_probs(th)
        ref = None if ref_logits is None else self.token_log_probs(ref_logits)
        g = row_grads(name, cfg, log_prob, self.token_log_probs(old_logits), self.adv, self.mask, weights, ref)
        (grad,) = torch.autograd.grad(log_prob, th, grad_outputs=self.sequence_probs(sampler_logits).unsqueeze(1) * g)
        return grad
