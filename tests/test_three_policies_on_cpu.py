"""Three policies: every RPG loss on stale data, checked by exact enumeration (docs/async.md#tests).

Samples come from a rollout policy μ ≠ π_old (an asynchronous trainer's stale or partial rollouts), π_old is the
proximal anchor the actor recomputes, π_θ is trained, π_ref is the KL reference. With verl's rollout-correction
weights `v = π_old/μ` (decoupled mode, `algorithm.rollout_correction.rollout_is`), every registered loss, called
through verl's policy-loss registry, must have the expected gradient

    Σ_y μ(y)·v(y)·∇L_y = Σ_y π_old(y)·∇L_y = −∇J(θ),   J = E_{π_θ}[A] − β·D(π_θ, π_ref),

with π_ref = π_old (iterative) or the reference model (frozen/periodic, ρ = π_ref/π_old), written in closed form
(tests/rpg_oracles.py) and differentiated by autograd. In bypass mode (π_old := μ, no weights) the same holds with
π_ref = μ for the iterative reference. Truncating v (TIS) has exactly the bias docs/async.md#truncation gives, and on
two-token responses verl's sequence-level weights are exact while token-level ones are not (docs/async.md#histories).
Negative controls: dropping v or ρ is caught by a clear margin.
"""

from __future__ import annotations

import pytest
import torch

import rpg.losses as L
from rpg_oracles import true_gradient
from three_policy_oracles import (
    NAMES, BETA, TwoStep, actor_config, one_step, one_step_expected_gradient, one_step_item_grads, tis_weights,
)  # fmt: skip

pytestmark = pytest.mark.usefixtures("ref_log_prob_adapter")  # losses with a reference, in-process

MODES = ("iterative", "frozen")
EXACT = 1e-10


def _div(name: str) -> str:
    return L.LOSSES[name].divergence.name


def _config(name: str, mode: str):
    return actor_config(name, reference=mode)


def _ref_row(name: str, mode: str, log_old, log_ref):
    """What verl ships as ref_log_prob: the reference model's log-probs, or (iterative) none — except for grpo_wk3,
    which always reads a reference model; giving it π_old there makes its reference the iterative one."""
    if mode == "frozen":
        return log_ref
    return log_old if L.LOSSES[name].needs_reference else None


def _target(name, theta, log_old, log_ref, adv, mode):
    """−∇J(θ) for the intended reference: π_old (iterative) or π_ref (frozen/periodic)."""
    return -true_gradient(_div(name), theta, log_old, log_old if mode == "iterative" else log_ref, adv, BETA)


def _column(x: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(1)


def _decoupled(name, mode, seed, *, threshold=None, drop_tis=False, ref_as_old=False):
    """(expected gradient on μ samples with verl's TIS weights, −∇J, max π_old/μ) for the one-step problem."""
    theta, log_old, log_mu, log_ref, adv = one_step(seed)
    mask = torch.ones(log_old.numel(), 1, dtype=torch.bool)
    kw = {} if threshold is None else {"threshold": threshold}
    weights = None if drop_tis else tis_weights(_column(log_old), _column(log_mu), mask, **kw)
    ref = _ref_row(name, mode, log_old, log_old if ref_as_old else log_ref)
    g = one_step_expected_gradient(name, theta, log_old, adv, _config(name, mode), log_mu, weights, ref)
    return g, _target(name, theta, log_old, log_ref, adv, mode), (log_old - log_mu).exp().max().item()


# ---------------------------------------------------------------------------------------------------------------
# decoupled mode: μ-samples with v = π_old/μ
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_tis_weights_make_rollout_samples_exact(name, mode, seed):
    """Σ_y μ(y)·(π_old/μ)(y)·∇L_y = −∇J for every registered loss, both reference kinds (docs/async.md#decoupled)."""
    g, target, max_ratio = _decoupled(name, mode, seed)
    assert max_ratio > 1.5  # the rollout policy really differs from π_old
    assert target.abs().max() > 1e-2
    assert (g - target).abs().max() < EXACT, (name, mode, (g - target).abs().max())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_dropping_the_tis_weight_is_caught(name, mode):
    """Negative control: without v (stale samples used as if π_old had drawn them) the gradient is that of the
    μ-weighted mixture, off by Σ_y (μ − π_old)(y)·∇L_y (docs/async.md#no-correction)."""
    g, target, _ = _decoupled(name, mode, 0, drop_tis=True)
    assert (g - target).abs().max() > 0.05 * target.abs().max() + 1e-3, name


@pytest.mark.parametrize("name", NAMES)
def test_dropping_rho_is_caught_on_stale_samples(name):
    """Negative control: with a frozen reference, shipping π_old as the reference (ρ ≡ 1) regularises toward π_old,
    not π_ref: the gradient is off by a clear margin although the TIS weights are right."""
    g, target, _ = _decoupled(name, "frozen", 0, ref_as_old=True)
    assert (g - target).abs().max() > 0.05 * target.abs().max() + 1e-3, name


# ---------------------------------------------------------------------------------------------------------------
# truncated importance sampling (verl's rollout_is_threshold)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_truncated_tis_has_the_documented_bias(name, mode):
    """With v̄ = min(π_old/μ, C): E_μ[v̄·∇L] = Σ_y min(π_old(y), C·μ(y))·∇L_y, so the bias against −∇J is exactly
    −Σ_y (π_old(y) − C·μ(y))₊·∇L_y (docs/async.md#truncation); it is not small here."""
    threshold, seed = 1.5, 1
    theta, log_old, log_mu, log_ref, adv = one_step(seed)
    ratio = (log_old - log_mu).exp()
    assert (ratio > threshold).any() and (ratio < threshold).any()
    g, target, _ = _decoupled(name, mode, seed, threshold=threshold)
    cfg = _config(name, mode)
    items = one_step_item_grads(name, theta, log_old, adv, cfg, None, _ref_row(name, mode, log_old, log_ref))
    p_old, mu = log_old.exp(), log_mu.exp()
    assert (g - torch.minimum(p_old, threshold * mu) @ items).abs().max() < EXACT
    bias = -(p_old - threshold * mu).clamp_min(0.0) @ items
    assert (g - target - bias).abs().max() < EXACT
    assert bias.abs().max() > 0.02 * target.abs().max()


# ---------------------------------------------------------------------------------------------------------------
# bypass mode: π_old := μ (the rollout's log-probs), no weights
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_bypass_is_exact_with_the_rollout_policy_as_anchor(name, mode):
    """Bypass: old_log_prob = μ's log-probs, verl ships no TIS weights (they would be μ/μ ≡ 1). The expected gradient
    is −∇J with π_ref = μ for the iterative reference (ρ = π_ref/μ for a frozen one): exact, but the KL anchor is
    the rollout policy, not the actor's current weights — a different objective whenever μ ≠ π_old
    (docs/async.md#bypass)."""
    theta, log_old, log_mu, log_ref, adv = one_step(1)
    mask = torch.ones(log_mu.numel(), 1, dtype=torch.bool)
    assert torch.equal(tis_weights(_column(log_mu), _column(log_mu), mask), torch.ones_like(mask, dtype=log_mu.dtype))
    ref = _ref_row(name, mode, log_mu, log_ref)
    g = one_step_expected_gradient(name, theta, log_mu, adv, _config(name, mode), log_mu, None, ref)
    target = _target(name, theta, log_mu, log_ref, adv, mode)
    assert (g - target).abs().max() < EXACT
    if mode == "iterative":  # the anchor moved from π_old to μ: not the decoupled objective
        decoupled = _target(name, theta, log_old, log_ref, adv, mode)
        assert (g - decoupled).abs().max() > 0.05 * decoupled.abs().max()


# ---------------------------------------------------------------------------------------------------------------
# two-token responses: verl's token- vs sequence-level weights on histories drawn by μ
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_sequence_weights_are_exact_on_histories_token_weights_are_not(name, mode):
    """Per-token items (h_t, y_t) with h_t drawn by μ: `rollout_is=sequence` (Π_t π_old/μ over the response) gives
    exactly the gradient the losses have on π_old samples (the synchronous case, which
    tests/test_gradients_on_cpu.py ties to −∇J); `rollout_is=token` corrects only the token's own factor and is
    biased through μ's histories and continuations (docs/async.md#histories)."""
    p = TwoStep(0)
    cfg = _config(name, mode)
    ref = p.ref if (mode == "frozen") else (p.old if L.LOSSES[name].needs_reference else None)
    on_policy = p.expected_gradient(name, cfg, p.old, p.old, None, ref)
    old_lp, mu_lp = p.token_log_probs(p.old), p.token_log_probs(p.mu)
    results = {}
    for level in ("sequence", "token"):
        weights = tis_weights(old_lp, mu_lp, p.mask, level=level)
        results[level] = p.expected_gradient(name, cfg, p.old, p.mu, weights, ref)
    scale = on_policy.abs().max()
    assert scale > 1e-2
    assert (results["sequence"] - on_policy).abs().max() < EXACT
    assert (results["token"] - on_policy).abs().max() > 0.02 * scale
