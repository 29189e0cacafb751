"""The top-k KL (rpg/topk_kl.py, docs/losses.md#topk-kl) by exact enumeration of an autoregressive toy (V = 5, 3 steps,
float64, tests/topk_toy.py), plus its numerics and the closed-form KL-share diagnostic.

* S = V: the expected gradient is β·∇ of the per-token KL objective exactly (both directions, iterative and frozen
  reference, on- and off-policy, either tail form);
* |S| < V: the difference is the documented bucket-tail bias β·∇Σ_h μ(h)·p_T·KL(p(·|T)‖q(·|T)) (reverse) resp.
  q_T·KL(q(·|T)‖p(·|T)) (forward), and zero with the sampled tail; with sequence credit the sampled tail is exact;
* mutants: the analytic part multiplied by w is caught by a variance check (S = V: the per-token gradient must not
  depend on the sampled token); a dropped sampled tail by the bias check.
"""

from __future__ import annotations

import pytest
import torch

import topk_toy as tt
from kl_toy import ARToy
from rpg import topk_kl as tk

BETA = 0.3
V = 5
CASES = [(d, r, on) for d in tk.DIRECTIONS for r in ("iterative", "frozen") for on in (False, True)]


def _error(g: torch.Tensor, target: torch.Tensor) -> float:
    return (g - target).abs().max().item()


@pytest.mark.parametrize("direction,reference,on_policy", CASES)
def test_full_support_is_the_exact_kl_gradient(direction, reference, on_policy):
    toy = ARToy(seed=1, steps=3, vocab=V, on_policy=on_policy)
    target = BETA * toy.grad("token", tt.DIV[direction], tt.reference_table(toy, reference))
    if not (on_policy and reference == "iterative"):  # there q = p and the KL gradient is 0
        assert target.abs().max() > 1e-2
    for tail in tk.TAILS:
        assert _error(tt.expected_gradient(toy, direction, tail, reference, V, BETA), target) < 1e-12


@pytest.mark.parametrize("direction,reference,on_policy", CASES)
def test_partial_support_bias_is_the_documented_tail_bias(direction, reference, on_policy):
    toy = ARToy(seed=1, steps=3, vocab=V, on_policy=on_policy)
    target = BETA * toy.grad("token", tt.DIV[direction], tt.reference_table(toy, reference))
    bias = tt.tail_bias_gradient(toy, direction, reference, 2, BETA)
    bucket = tt.expected_gradient(toy, direction, "bucket", reference, 2, BETA)
    assert _error(bucket, target - bias) < 1e-12
    if not (on_policy and reference == "iterative"):
        assert bias.abs().max() > 1e-3  # the bias is real: the check below would see a dropped tail
    assert _error(tt.expected_gradient(toy, direction, "sampled", reference, 2, BETA), target) < 1e-12


@pytest.mark.parametrize("direction", tk.DIRECTIONS)
@pytest.mark.parametrize("reference", ["iterative", "frozen"])
def test_sequence_credit_with_the_sampled_tail_is_exact(direction, reference):
    toy = ARToy(seed=2, steps=3, vocab=V)
    target = BETA * toy.grad("sequence", tt.DIV[direction], tt.reference_table(toy, reference))
    token = BETA * toy.grad("token", tt.DIV[direction], tt.reference_table(toy, reference))
    if not (direction == "forward" and reference == "iterative"):  # there sequence = token credit
        assert _error(target, token) > 1e-3
    for k in (V, 2):
        g = tt.expected_gradient(toy, direction, "sampled", reference, k, BETA, credit="sequence")
        assert _error(g, target) < 1e-12


def _within_history_variance(toy, direction, reference, k, **kw) -> float:
    """Σ_h μ(h)·Var_{y~μ(·|h)}[∇_z K(h, y)]: the part of the per-token gradient that depends on the sampled token."""
    g = tt._token_gradients(toy, lambda z: tt.token_losses(toy, z, direction, "sampled", reference, k, BETA, **kw))
    g = g.reshape(-1, V)
    rows = toy.history.reshape(-1)
    # each history h appears V^(S−1−|h|) times per token with weights μ(y|h); use the per-row μ(y|h) directly
    mu_y = torch.softmax(toy.old, -1)[rows, toy.token.reshape(-1)]
    count = torch.zeros(len(toy.prefixes), dtype=torch.float64).index_add_(0, rows, torch.ones_like(mu_y))
    w = mu_y / count[rows] * V  # every (h, y) pair appears count[h]/V times
    mean = torch.zeros(len(toy.prefixes), V, dtype=torch.float64).index_add_(0, rows, w[:, None] * g)
    dev = ((g - mean[rows]) ** 2).sum(-1)
    per_row = torch.zeros(len(toy.prefixes), dtype=torch.float64).index_add_(0, rows, w * dev)
    return float((tt.history_probs(toy) * per_row).sum())


@pytest.mark.parametrize("direction", tk.DIRECTIONS)
def test_a_w_weighted_analytic_part_is_caught_by_the_variance_check(direction):
    toy = ARToy(seed=3, steps=3, vocab=V)
    # unbiased: the bias check alone cannot see it
    target = BETA * toy.grad("token", tt.DIV[direction], toy.ref)
    mutant = tt.expected_gradient(toy, direction, "sampled", "frozen", V, BETA, mutant="w_times_analytic")
    assert _error(mutant, target) < 1e-12
    # with S = V the analytic gradient of a position does not depend on the sampled token; w·(analytic) does
    assert _within_history_variance(toy, direction, "frozen", V) < 1e-25
    assert _within_history_variance(toy, direction, "frozen", V, mutant="w_times_analytic") > 1e-4


@pytest.mark.parametrize("direction", tk.DIRECTIONS)
def test_a_dropped_tail_is_caught_by_the_bias_check(direction):
    toy = ARToy(seed=3, steps=3, vocab=V)
    target = BETA * toy.grad("token", tt.DIV[direction], toy.ref)
    dropped = tt.expected_gradient(toy, direction, "sampled", "frozen", 2, BETA, mutant="no_tail")
    assert _error(dropped, target) > 1e-3


def test_topk_has_less_gradient_variance_than_the_sampled_estimator():
    toy = ARToy(seed=1, steps=3, vocab=V)
    for direction in tk.DIRECTIONS:
        sampled = tt.gradient_variance(toy, tt.sampled_estimator_gradients(toy, direction, "frozen", BETA))
        full = tt.gradient_variance(toy, tt.per_sample_gradients(toy, direction, "sampled", "frozen", V, BETA))
        assert full < 0.1 * sampled


# ---- numerics, options, the diagnostic ------------------------------------------------------------------------------
def _problem(n=9, vocab=11, k=4, dtype=torch.float64, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(n, vocab, generator=g)).to(dtype)
    old = logits + 0.5 * torch.randn(n, vocab, generator=g).to(dtype)
    ref = logits + 0.8 * torch.randn(n, vocab, generator=g).to(dtype)
    token = torch.randint(vocab, (n,), generator=g)  # any token: the per-token algebra holds for every y
    adv = torch.randn(n, generator=g).to(dtype)
    sup = tk.select_support(old, k)
    sup = tk.Support(sup.ids, tk.gather_log_probs(ref, sup.ids))
    lp = lambda x: torch.log_softmax(x.double(), -1).gather(1, token[:, None]).squeeze(1).to(dtype)  # noqa: E731
    return logits, sup, token, adv, lp(old), lp(ref)


def _loss_and_grad(logits, sup, token, old, ref, direction, tail, mask=None, chunk=2, beta=BETA):
    z = logits.detach().clone().requires_grad_(True)
    mask = torch.ones(z.shape[0], dtype=torch.bool) if mask is None else mask
    terms = tk.topk_kl(z, sup, direction, tail, mask=mask, chunk_tokens=chunk, with_sum_sq=True)
    log_prob = torch.log_softmax(torch.where(mask[:, None], z, 0.0), -1).gather(1, token[:, None]).squeeze(1)
    inside = tk.in_support(sup.ids, token)
    kl = terms.kl
    if tail == "sampled":
        kl = kl + tk.sampled_tail(log_prob, old, ref, inside, mask, direction)
    (g,) = torch.autograd.grad(beta * kl.sum(), z)
    return kl.detach(), g, terms, log_prob.detach(), inside


@pytest.mark.parametrize("direction", tk.DIRECTIONS)
@pytest.mark.parametrize("tail", tk.TAILS)
@pytest.mark.parametrize("k", [1, 4, 11])
def test_kl_share_closed_form_equals_autograd(direction, tail, k):
    logits, sup, token, adv, old, ref = _problem(k=k)
    mask = torch.ones(logits.shape[0], dtype=torch.bool)
    mask[-1] = False
    _, g, terms, log_prob, inside = _loss_and_grad(logits, sup, token, old, ref, direction, tail, mask)
    share = tk.kl_share(terms, BETA, adv, log_prob, inside, mask, old, ref)
    torch.testing.assert_close(share.kl_grad_norm, g.norm(dim=-1), rtol=1e-10, atol=1e-14)
    p = torch.softmax(logits, -1)
    e_y = torch.nn.functional.one_hot(token, logits.shape[1]).double()
    adv_norm = torch.where(mask, adv.abs() * (e_y - p).norm(dim=-1), 0.0)
    torch.testing.assert_close(share.adv_grad_norm, adv_norm, rtol=1e-10, atol=1e-14)
    assert (~inside[mask]).any() or tail == "bucket" or k == 11  # the sampled tail's branch is exercised


@pytest.mark.parametrize("direction", tk.DIRECTIONS)
@pytest.mark.parametrize("tail", tk.TAILS)
def test_chunked_equals_unchunked(direction, tail):
    logits, sup, token, _, old, ref = _problem(n=13)
    a = _loss_and_grad(logits, sup, token, old, ref, direction, tail, chunk=3)
    b = _loss_and_grad(logits, sup, token, old, ref, direction, tail, chunk=10**6)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-15)
    s3 = tk.select_support(logits, 4, chunk_tokens=3)
    s1 = tk.select_support(logits, 4)
    assert torch.equal(s3.ids, s1.ids) and torch.equal(s3.log_probs, s1.log_probs)
    torch.testing.assert_close(tk.gather_log_probs(logits, s1.ids, chunk_tokens=2), s1.log_probs, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("direction", tk.DIRECTIONS)
@pytest.mark.parametrize("tail", tk.TAILS)
def test_extreme_logits_and_padding_garbage_stay_finite(dtype, direction, tail):
    logits, sup, token, adv, old, ref = _problem(n=8, dtype=dtype, scale=1e4)
    logits[0, :5] = -float("inf")  # masked vocabulary entries
    logits[1] = 3e4
    logits[1, 0] = -3e4
    mask = torch.ones(8, dtype=torch.bool)
    mask[-2:] = False
    logits[-2] = float("nan")  # padding garbage
    logits[-1] = float("inf")
    log_probs = sup.log_probs.clone()
    log_probs[2, 0] = -float("inf")  # the reference gives a support token no mass
    log_probs[-2:] = float("nan")
    sup = tk.Support(sup.ids, log_probs)
    old[-2:], ref[-2:] = float("nan"), float("nan")
    kl, g, terms, log_prob, inside = _loss_and_grad(logits, sup, token, old, ref, direction, tail, mask)
    assert torch.isfinite(kl).all() and torch.isfinite(g).all(), (kl, g)
    assert (kl[~mask] == 0).all() and (g[~mask] == 0).all()
    share = tk.kl_share(terms, BETA, adv, log_prob, inside, mask, old, ref)
    assert torch.isfinite(share.kl_grad_norm).all() and torch.isfinite(share.adv_grad_norm).all()


def test_k_above_the_vocabulary_and_unknown_options_are_refused():
    logits = torch.zeros(3, 5)
    with pytest.raises(ValueError, match=r"k=6: .*1 ≤ k ≤ the vocabulary size \(5\)"):
        tk.select_support(logits, 6)
    with pytest.raises(ValueError, match=r"k=0"):
        tk.check_k(0, 5)
    sup = tk.select_support(logits, 2)
    with pytest.raises(ValueError, match=r"direction='both'; choose one of \('reverse', 'forward'\)"):
        tk.topk_kl(logits, sup, "both", "bucket")
    with pytest.raises(ValueError, match=r"tail='none'; choose one of \('sampled', 'bucket'\)"):
        tk.topk_kl(logits, sup, "reverse", "none")
    with pytest.raises(ValueError, match=r"support width k=7"):
        tk.topk_kl(logits, tk.Support(torch.zeros(3, 7, dtype=torch.int32), torch.zeros(3, 7)), "reverse", "bucket")
