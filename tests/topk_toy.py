"""The top-k KL estimator on the autoregressive toy of `kl_toy.py`, enumerated exactly (tests/test_topk_kl_on_cpu.py,
benchmarks/bench_topk_kl.py; docs/losses.md#topk-kl).

Every response of `ARToy` (V^S of them, probability μ(y) under π_old) contributes the loss Σ_t β·K_t with K_t the
top-k KL of its position t (analytic part at the support S of the history, plus the tail). The support of a history is
the top-k of π_old (reverse KL) or of π_ref (forward KL) at that history. The expected gradient Σ_y μ(y)·∇loss(y) is
compared with β·∇ of the objectives of `kl_toy.py` and with the tail bias written here from its definition
(p_T·KL(p(·|T)‖q(·|T)) resp. q_T·KL(q(·|T)‖p(·|T)), one history at a time). Nothing here imports the estimator's
formulas: only `rpg.topk_kl`'s public functions are called.
"""

from __future__ import annotations

import torch

from kl_toy import ARToy
from rpg import topk_kl as tk

DIV = {"reverse": "rkl", "forward": "fkl"}  # the kl_toy row with the same per-position KL


def reference_table(toy: ARToy, reference: str) -> torch.Tensor:
    return toy.old if reference == "iterative" else toy.ref


def history_probs(toy: ARToy) -> torch.Tensor:
    """μ(h) of every history row (the weights of the per-token objective)."""
    log_old = torch.log_softmax(toy.old, -1)
    out = []
    for p in toy.prefixes:
        out.append(sum((log_old[toy.row[p[:k]], p[k]] for k in range(len(p))), torch.zeros((), dtype=torch.float64)))
    return torch.stack(out).exp()


def row_support(toy: ARToy, direction: str, reference: str, k: int) -> tk.Support:
    """Per history row: S = top-k of π_old (reverse) or π_ref (forward) and log q at S."""
    ref = reference_table(toy, reference)
    chooser = toy.old if direction == "reverse" else ref
    sup = tk.select_support(chooser, k)
    return tk.Support(sup.ids, tk.gather_log_probs(ref, sup.ids))


def token_losses(toy: ARToy, logits: torch.Tensor, direction: str, tail: str, reference: str, k: int, beta: float,
                 credit: str = "token", mutant: str | None = None) -> torch.Tensor:  # fmt: skip
    """(V^S, S) loss of every token of every response from the flat logits (V^S·S, V) of its history; each token's
    loss depends on its own row only. mutant: 'w_times_analytic' (analytic part multiplied by w) or 'no_tail'."""
    n, steps = toy.token.shape
    rows = toy.history.reshape(-1)
    sup = row_support(toy, direction, reference, k)
    support = tk.Support(sup.ids[rows], sup.log_probs[rows])
    kl = tk.topk_kl(logits, support, direction, tail, chunk_tokens=7).kl
    token = toy.token.reshape(-1)
    log_prob = torch.log_softmax(logits, -1).gather(1, token[:, None]).squeeze(1)
    old = toy.token_log_probs(toy.old).reshape(-1)
    ref = None if reference == "iterative" else toy.token_log_probs(toy.ref).reshape(-1)
    inside = tk.in_support(support.ids, token)
    if mutant == "w_times_analytic":
        kl = kl * torch.exp(log_prob - old)
    if tail == "sampled" and mutant != "no_tail":
        kl = kl + tk.sampled_tail(log_prob, old, ref, inside, torch.ones_like(inside), direction)
    kl = kl.reshape(n, steps)
    if credit == "sequence":
        log_w = (log_prob - old).reshape(n, steps)
        log_rho = 0.0 if ref is None else (ref - old).reshape(n, steps)
        return tk.sequence_credited(kl, log_w, log_rho, torch.ones(n, steps, dtype=torch.bool), beta, direction)
    return beta * kl


def _token_gradients(toy: ARToy, loss_fn) -> torch.Tensor:
    """(V^S, S, V): the gradient of each token's loss with respect to the logits of its history (one backward)."""
    logits = toy.theta[toy.history.reshape(-1)].detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss_fn(logits).sum(), logits)
    return g.reshape(*toy.token.shape, -1)


def per_sample_gradients(toy: ARToy, direction: str, tail: str, reference: str, k: int, beta: float,
                         **kw) -> torch.Tensor:  # fmt: skip
    """(V^S, rows, V): the gradient of each response's loss with respect to the logit table."""
    g = _token_gradients(toy, lambda z: token_losses(toy, z, direction, tail, reference, k, beta, **kw))
    return _to_table(toy, g)


def _to_table(toy: ARToy, g: torch.Tensor) -> torch.Tensor:
    n, steps = toy.token.shape
    out = torch.zeros(n, len(toy.prefixes), g.shape[-1], dtype=g.dtype)
    seq = torch.arange(n).unsqueeze(1).expand(n, steps)
    return out.index_put_((seq.reshape(-1), toy.history.reshape(-1)), g.reshape(n * steps, -1), accumulate=True)


def expected_gradient(toy: ARToy, direction: str, tail: str, reference: str, k: int, beta: float, **kw) -> torch.Tensor:
    """Σ_y μ(y)·∇loss(y) with respect to the logit table."""
    mu = toy.sequence_probs(toy.old)
    return (mu[:, None, None] * per_sample_gradients(toy, direction, tail, reference, k, beta, **kw)).sum(0)


def sampled_estimator_gradients(toy: ARToy, direction: str, reference: str, beta: float) -> torch.Tensor:
    """(V^S, rows, V): per-response gradients of the one-sample estimator the RPG losses use (no top-k), written from
    its definition: β·Σ_t w·log(w/ρ) (reverse) or β·Σ_t ρ·log(ρ/w) (forward)."""
    old = toy.token_log_probs(toy.old).reshape(-1)
    log_rho = toy.token_log_probs(reference_table(toy, reference)).reshape(-1) - old

    def losses(z):
        log_w = torch.log_softmax(z, -1).gather(1, toy.token.reshape(-1, 1)).squeeze(1) - old
        if direction == "reverse":
            return beta * log_w.exp() * (log_w - log_rho)
        return beta * log_rho.exp() * (log_rho - log_w)

    return _to_table(toy, _token_gradients(toy, losses))


def gradient_variance(toy: ARToy, grads: torch.Tensor) -> float:
    """Σ_y μ(y)·‖g(y) − E g‖² (the trace of the per-response gradient covariance)."""
    mu = toy.sequence_probs(toy.old)
    mean = (mu[:, None, None] * grads).sum(0)
    return float((mu * ((grads - mean) ** 2).sum((1, 2))).sum())


def tail_bias_gradient(toy: ARToy, direction: str, reference: str, k: int, beta: float) -> torch.Tensor:
    """β·∇ Σ_h μ(h)·B(h): B = p_T·KL(p(·|T)‖q(·|T)) (reverse) or q_T·KL(q(·|T)‖p(·|T)) (forward), from definitions."""
    th = toy.theta.clone().requires_grad_(True)
    sup = row_support(toy, direction, reference, k)
    in_t = torch.ones_like(th, dtype=torch.bool).scatter(1, sup.ids.long(), False)
    p = torch.softmax(th, -1)
    q = torch.softmax(reference_table(toy, reference), -1)
    p_t = (p * in_t).sum(-1, keepdim=True)
    q_t = (q * in_t).sum(-1, keepdim=True)
    pc, qc = p / p_t, q / q_t
    if direction == "reverse":
        bias = p_t.squeeze(-1) * torch.where(in_t, pc * (pc.log() - qc.log()), 0.0).sum(-1)
    else:
        bias = q_t.squeeze(-1) * torch.where(in_t, qc * (qc.log() - pc.log()), 0.0).sum(-1)
    (g,) = torch.autograd.grad(beta * (history_probs(toy) * bias).sum(), th)
    return g
