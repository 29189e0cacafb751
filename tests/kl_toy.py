"""An autoregressive toy policy, enumerated exactly, for the KL add-on and sequence-credit tests
(tests/test_kl_addon_on_cpu.py; docs/losses.md#kl-credit).

Responses are `S` tokens over `V` symbols; a policy is a logit table with one row per history (every prefix of length
< S). Three distinct policies: π_θ (trained), π_old (the sampler) and π_ref (the KL reference). Every tensor of a
batch has one row per response (all V^S of them, in lexicographic order) and S columns. Nothing here imports the
divergence table: the objectives are written from their definitions (paper eqs. E.1, E.2, 3.1, 3.3 for one history;
the chain rule of the KL for whole responses).
"""

from __future__ import annotations

import itertools

import torch

REVERSE = {"fkl": False, "ufkl": False, "rkl": True, "urkl": True}


class ARToy:
    def __init__(self, seed: int, steps: int = 3, vocab: int = 2, spread: float = 0.6, ref_spread: float = 0.7,
                 on_policy: bool = False):  # fmt: skip
        self.S, self.V = steps, vocab
        prefixes = [p for n in range(steps) for p in itertools.product(range(vocab), repeat=n)]
        self.row = {p: i for i, p in enumerate(prefixes)}
        self.prefixes = prefixes
        self.seqs = list(itertools.product(range(vocab), repeat=steps))
        self.history = torch.tensor([[self.row[y[:t]] for t in range(steps)] for y in self.seqs])
        self.token = torch.tensor(self.seqs)
        g = torch.Generator().manual_seed(500 + seed)

        def noise():
            return torch.randn(len(prefixes), vocab, generator=g, dtype=torch.float64)

        self.old = noise()
        self.theta = self.old.clone() if on_policy else self.old + spread * noise()
        self.ref = self.old + ref_spread * noise()
        self.adv = (torch.randn(len(self.seqs), 1, generator=g, dtype=torch.float64) - 0.2).expand(-1, steps).clone()
        self.mask = torch.ones(len(self.seqs), steps, dtype=torch.bool)

    # ---- batch tensors -------------------------------------------------------------------------------------------
    def token_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(V^S, S): log p(y_t | h_t) of every token of every response."""
        return torch.log_softmax(logits, -1)[self.history, self.token]

    def sequence_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return self.token_log_probs(logits).sum(1).exp()

    # ---- objectives ----------------------------------------------------------------------------------------------
    @staticmethod
    def _div(div: str, log_p: torch.Tensor, log_r: torch.Tensor) -> torch.Tensor:
        """D(p, r) over the last dim for the row `div` (p = π_θ, r = π_ref)."""
        p, r = log_p.exp(), log_r.exp()
        if div in ("rkl", "urkl"):
            d = (p * (log_p - log_r)).sum(-1)
            return d + (r - p).sum(-1) if div == "urkl" else d
        d = (r * (log_r - log_p)).sum(-1)
        return d + (p - r).sum(-1) if div == "ufkl" else d

    def token_objective(self, div: str, theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """Σ_t E_{h_t ~ π_old}[D(π_θ(·|h_t), π_ref(·|h_t))]: the per-token objective (kl_credit=token)."""
        log_old = torch.log_softmax(self.old, -1)
        weights = []
        for p in self.prefixes:
            lp = sum((log_old[self.row[p[:k]], p[k]] for k in range(len(p))), torch.zeros((), dtype=torch.float64))
            weights.append(lp.exp())
        per_history = self._div(div, torch.log_softmax(theta, -1), torch.log_softmax(ref, -1))
        return (torch.stack(weights) * per_history).sum()

    def sequence_objective(self, div: str, theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """D(π_θ(·|x), π_ref(·|x)) between whole responses, by enumeration."""
        log_p = self.token_log_probs(theta).sum(1)
        log_r = self.token_log_probs(ref).sum(1)
        return self._div(div, log_p, log_r)

    def grad(self, objective: str, div: str, ref: torch.Tensor) -> torch.Tensor:
        th = self.theta.clone().requires_grad_(True)
        fn = self.token_objective if objective == "token" else self.sequence_objective
        (g,) = torch.autograd.grad(fn(div, th, ref), th)
        return g


# ---- variable response lengths (tests/test_kl_aggregation_on_cpu.py; docs/losses.md#kl-aggregation) ---------------
EOS = 0  # the end-of-sequence symbol of `EOSToy`


class EOSToy(ARToy):
    """`ARToy` with an end-of-sequence symbol (0): a response stops after EOS or after `S` tokens (verl's
    max_response_length), so |y| ∈ 1..S depends on the sampled tokens. Histories are the unfinished prefixes (no EOS,
    length < S); every tensor has one row per response, padded to S columns, `mask` 0 after the response's end."""

    def __init__(self, seed: int, steps: int = 3, vocab: int = 3, spread: float = 0.6, ref_spread: float = 0.7):
        super().__init__(seed, 1, vocab, spread, ref_spread)  # the logit tables are redrawn below
        self.S, self.V = steps, vocab
        words = [p for n in range(steps) for p in itertools.product(range(1, vocab), repeat=n)]
        self.prefixes, self.row = words, {p: i for i, p in enumerate(words)}
        self.seqs = [p + (EOS,) for p in words] + [p + (y,) for p in words if len(p) == steps - 1 for y in
                                                   range(1, vocab)]  # fmt: skip
        self.lengths = torch.tensor([len(y) for y in self.seqs])
        self.mask = torch.arange(steps).unsqueeze(0) < self.lengths.unsqueeze(1)
        self.token = torch.tensor([list(y) + [EOS] * (steps - len(y)) for y in self.seqs])
        self.history = torch.tensor([[self.row[y[:t]] if t < len(y) else 0 for t in range(steps)] for y in self.seqs])
        g = torch.Generator().manual_seed(900 + seed)

        def noise():
            return torch.randn(len(words), vocab, generator=g, dtype=torch.float64)

        self.old = noise()
        self.theta = self.old + spread * noise()
        self.ref = self.old + ref_spread * noise()
        self.adv = torch.zeros(len(self.seqs), steps, dtype=torch.float64)

    def token_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(responses, S): log p(y_t | h_t), 0 after the response's end."""
        return torch.where(self.mask, super().token_log_probs(logits), 0.0)

    def history_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """π(h) of every unfinished prefix h under the policy `logits` (the chance the sampler reaches it)."""
        log_p = torch.log_softmax(logits, -1)
        out = [sum((log_p[self.row[h[:k]], h[k]] for k in range(len(h))), torch.zeros((), dtype=torch.float64))
               for h in self.prefixes]  # fmt: skip
        return torch.stack(out).exp()

    def token_objective(self, div: str, theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """Σ_h π_old(h)·D(π_θ(·|h), π_ref(·|h)) over the unfinished prefixes: the per-token objective."""
        per_history = self._div(div, torch.log_softmax(theta, -1), torch.log_softmax(ref, -1))
        return (self.history_probs(self.old) * per_history).sum()


def multisets(n: int, size: int):
    """(index tuple, multiplicity) of every batch of `size` draws from `n` responses, order ignored: the number of
    ordered batches with these members (Σ multiplicity = n^size)."""
    from math import factorial, prod

    for combo in itertools.combinations_with_replacement(range(n), size):
        counts = [combo.count(i) for i in set(combo)]
        yield combo, factorial(size) // prod(factorial(c) for c in counts)
