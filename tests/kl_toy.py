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
