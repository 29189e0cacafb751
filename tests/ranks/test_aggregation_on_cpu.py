"""Loss aggregation over ranks and micro-batches, pinned in-process: the RPG losses honour verl's `global_batch_info`.

verl 0.9.1 splits one optimizer step's mini-batch (G sequences) over R data-parallel ranks (the dispatch chunks the
batch: G/R rows per rank) and, on each rank, into micro-batches (`prepare_micro_batches`: fixed size, or balanced by
tokens with `use_dynamic_bsz`). Each micro-batch calls `ppo_loss` and back-propagates; the gradients accumulate over
micro-batches and FSDP *averages* them over ranks. For the accumulated gradient to be the gradient of the loss of the
whole mini-batch, every micro-batch loss must be normalised by *global* counts: the engine
(`FSDPEngine.forward_backward_batch`) all-reduces the response tokens into `batch_num_tokens` and sets
`dp_size = R`, the trainer (`_update_actor`) sets `global_batch_size = ppo_mini_batch_size × n`, and `ppo_loss`
copies them into `config.global_batch_info`, which a registered loss must pass to `agg_loss`.

This test reproduces exactly that (verl's own `left_right_2_no_padding`, `chunk_tensordict`, `prepare_micro_batches`
and `ppo_loss`; a softmax policy with one shared weight matrix stands in for the model) and checks, for every
`loss_agg_mode`, for a fully differentiable (RPG-RKL), a REINFORCE-style (RPG-REINFORCE-URKL) RPG loss and verl's own
`vanilla` as a control, with fixed-size and token-balanced micro-batches, that

    (1/R) Σ_ranks Σ_micro-batches ∇ loss(micro-batch)  ==  ∇ loss(whole mini-batch in one piece)

in float32 to 1e-5 relative. The sequences have very different lengths, so a loss that normalises per micro-batch
(ignores `batch_num_tokens` / `global_batch_size` / `dp_size`) fails every mode. The same property through verl's
real FSDP2 engine on 2 gloo ranks: tests/ranks/test_aggregation_engine_on_cpu.py.
"""

from __future__ import annotations

import pytest
import torch
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils.losses import ppo_loss

from verl_batch import actor_config, make_batch

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSSES = ["rpg_rkl", "rpg_reinforce_urkl", "vanilla"]  # fully differentiable, REINFORCE-style, verl's own (control)
REFUSED = "seq-mean-token-mean"  # for an RPG loss (tests/test_kl_aggregation_on_cpu.py)
CASES = [(loss, agg) for loss in LOSSES for agg in AGG_MODES if not (loss.startswith("rpg") and agg == REFUSED)]
RANKS, MICRO = 2, 2
# one mini-batch of 8 sequences: 2 ranks × 2 micro-batches × 2 sequences; response lengths 1..9 (unequal token counts)
PROMPT_LENS = [3, 1, 4, 2, 2, 4, 1, 3]
RESPONSE_LENS = [9, 1, 2, 7, 3, 8, 1, 5]
PROMPT_W, RESPONSE_W, VOCAB, DIM = 4, 9, 7, 5


def config(loss_mode: str, agg: str) -> ActorConfig:
    # kl_coef large enough that the KL term matters (RPG losses only: verl's own refuse it); (0.2, 0.28, c=3) so every
    # dual-clip branch occurs
    cfg = actor_config(loss_mode, strategy="fsdp2", c=3.0, agg=agg,
                       **({"kl_coef": 0.2} if loss_mode.startswith("rpg") else {}))
    object.__setattr__(cfg, "loss_scale_factor", RESPONSE_W)  # seq-mean-token-sum-norm's constant (ppo_loss copies it)
    return cfg


class SoftmaxPolicy:
    """log π(a_t | token_t, position_t) = log_softmax(E[token] θ + P[position])[a_t], one shared θ (DIM × VOCAB).

    Computed from the micro-batch's own (nested, no-padding) input ids and positions, as the engine's model does;
    returns verl's model output layout: flat per-token log-probs over prompt+response, shape (total_nnz,).
    """

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(64, DIM, generator=g)
        self.pos = torch.randn(PROMPT_W + RESPONSE_W, VOCAB, generator=g) * 0.3
        self.theta = (torch.randn(DIM, VOCAB, generator=g) * 0.5).requires_grad_(True)

    def log_probs(self, td) -> torch.Tensor:
        ids, pos = td["input_ids"].values(), td["position_ids"].values()
        logits = self.embed[ids] @ self.theta + self.pos[pos]
        return torch.log_softmax(logits, -1).gather(-1, ((ids * 3 + pos) % VOCAB)[:, None]).squeeze(-1)


def mini_batch(policy: SoftmaxPolicy):
    """The mini-batch as verl's actor receives it: no-padding TensorDict with old log-probs and advantages."""
    td, mask, attn = make_batch(PROMPT_LENS, RESPONSE_LENS, PROMPT_W, RESPONSE_W, seed=1)
    from verl.workers.utils.padding import no_padding_2_padding

    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        current = no_padding_2_padding(policy.log_probs(td), td)
    # π_old off the current policy by up to ±0.8 in log space: ratios on both sides of 1−ε1, 1+ε2 and c
    td["old_log_probs"] = (current + 0.8 * (2 * torch.rand(current.shape, generator=g) - 1)) * mask
    td["advantages"] = torch.tensor([1.0, -1.0, 0.5, -2.0, 1.5, -0.5, 2.0, -1.5])[:, None] * mask
    return td


def grad_one_piece(policy: SoftmaxPolicy, td, cfg: ActorConfig) -> torch.Tensor:
    """∇ of the loss of the whole mini-batch in one call (one rank, one micro-batch: local = global counts)."""
    whole = td.clone()
    tu.assign_non_tensor(whole, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    loss, _ = ppo_loss(cfg, {"log_probs": policy.log_probs(whole)}, whole)
    (grad,) = torch.autograd.grad(loss, policy.theta)
    return grad


def grad_split(policy: SoftmaxPolicy, td, cfg: ActorConfig, dynamic_bsz: bool) -> tuple[torch.Tensor, int]:
    """Σ over micro-batches per rank, then the average over ranks (FSDP's gradient reduction), as verl splits it."""
    total_tokens = int(td["response_mask"].sum())  # the engine's all-reduced `loss_mask.sum()`
    rank_grads, n_micro = [], 0
    for rank_td in tu.chunk_tensordict(td, RANKS):  # the dispatch: contiguous chunks, one per dp rank
        global_info = dict(dp_size=RANKS, batch_num_tokens=total_tokens, global_batch_size=len(td))
        micro = dict(micro_batch_size_per_gpu=len(td) // (RANKS * MICRO), max_token_len_per_gpu=12)
        tu.assign_non_tensor(rank_td, use_dynamic_bsz=dynamic_bsz, **global_info, **micro)
        micro_batches, _ = prepare_micro_batches(rank_td)
        grad = torch.zeros_like(policy.theta)
        for mb in micro_batches:
            loss, _ = ppo_loss(cfg, {"log_probs": policy.log_probs(mb)}, mb)
            grad += torch.autograd.grad(loss, policy.theta)[0]
        rank_grads.append(grad)
        n_micro += len(micro_batches)
    return torch.stack(rank_grads).mean(0), n_micro


@pytest.mark.parametrize("dynamic_bsz", [False, True], ids=["fixed-micro", "dynamic-bsz"])
@pytest.mark.parametrize("loss_mode,agg", CASES)
def test_micro_batches_over_ranks_give_the_one_piece_gradient(loss_mode, agg, dynamic_bsz):
    policy = SoftmaxPolicy()
    td = mini_batch(policy)
    cfg = config(loss_mode, agg)
    reference = grad_one_piece(policy, td, cfg)
    split, n_micro = grad_split(policy, td, cfg, dynamic_bsz)
    assert n_micro >= RANKS * MICRO  # really split: ≥ 2 micro-batches on each of the 2 ranks
    assert reference.norm() > 1e-3
    torch.testing.assert_close(split, reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()))


class _Blind(dict):
    """A `global_batch_info` that drops what `ppo_loss` writes into it: the loss then sees no global counts."""

    def __setitem__(self, key, value):
        pass


@pytest.mark.parametrize("agg", [m for m in AGG_MODES if m != REFUSED])
def test_a_loss_blind_to_global_batch_info_fails(agg):
    """The check has teeth: hiding `global_batch_info` from the loss (per-micro-batch normalisation) misses the
    one-piece gradient in every mode by far more than the tolerance (seq-mean-token-sum-norm, blind to its fixed
    scale too, is refused by the loss)."""
    policy = SoftmaxPolicy()
    td = mini_batch(policy)
    cfg = config("rpg_reinforce_urkl", agg)
    reference = grad_one_piece(policy, td, cfg)
    object.__setattr__(cfg, "global_batch_info", _Blind())
    if agg == "seq-mean-token-sum-norm":
        with pytest.raises(ValueError, match="no actor_rollout_ref.actor.loss_scale_factor"):
            grad_split(policy, td, cfg, dynamic_bsz=False)
        return
    split, _ = grad_split(policy, td, cfg, dynamic_bsz=False)
    assert (split - reference).norm() > 0.05 * reference.norm(), agg
