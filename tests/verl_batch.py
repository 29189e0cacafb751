"""Build the TensorDict that verl 0.9.1's actor hands to `ppo_loss`, without a model, and the actor config it reads
(test helper).

The engine converts a left/right-padded DataProto with `left_right_2_no_padding` and calls
`ppo_loss(config, {"log_probs": <flat per-token log-probs over prompt+response>}, data)`. This module reproduces that
input so tests can drive verl's real loss wiring (`verl/workers/utils/losses.py`) on CPU.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding


def make_batch(prompt_lens, response_lens, prompt_width=4, response_width=5, seed=0, extra=None):
    """Left-padded prompts, right-padded responses. Returns (td, response_mask, flat_index).

    `flat_index` maps each valid (row, position-in-sequence) token to its index in the flat no-padding layout, so a
    padded (bs, response_width) tensor `x` can be flattened to the model-output layout with `to_flat(x, ...)`.
    """
    g = torch.Generator().manual_seed(seed)
    bs = len(prompt_lens)
    attn = torch.zeros(bs, prompt_width + response_width, dtype=torch.long)
    response_mask = torch.zeros(bs, response_width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attn[i, prompt_width - p : prompt_width] = 1
        attn[i, prompt_width : prompt_width + r] = 1
        response_mask[i, :r] = 1
    input_ids = torch.randint(3, 50, (bs, prompt_width + response_width), generator=g) * attn
    position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
    fields = {
        "input_ids": input_ids,
        "attention_mask": attn,
        "position_ids": position_ids,
        "prompts": input_ids[:, :prompt_width],
        "responses": input_ids[:, prompt_width:],
        "response_mask": response_mask,
    }
    fields.update(extra or {})
    td = left_right_2_no_padding(TensorDict(fields, batch_size=[bs]))
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    return td, response_mask.bool(), attn.bool()


def to_flat(response_values: torch.Tensor, attn: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """Padded response values (bs, R) → flat per-token tensor over every valid prompt+response token.

    verl reads the log-prob of response token j at the position before it (`no_padding_2_padding` left-shifts by
    one), so value j goes to sequence position `prompt_width − 1 + j`; other positions hold 0.
    """
    bs, _ = attn.shape
    head = torch.zeros(bs, prompt_width - 1, dtype=response_values.dtype)
    tail = torch.zeros(bs, 1, dtype=response_values.dtype)
    return torch.cat([head, response_values, tail], dim=1)[attn]


def actor_config(loss_mode: str = "rpg_urkl", *, strategy: str = "fsdp", low: float = 0.2, high: float = 0.28,
                 c: float = 10.0, agg: str = "token-mean", micro: int = 2, **policy):  # fmt: skip
    """verl's `ActorConfig` for a loss test: clip range (1 − low, 1 + high), dual-clip constant `c`, aggregation `agg`,
    `micro` sequences per micro-batch, and `RPGPolicyLossConfig(loss_mode=loss_mode, **policy)` (RPG options such as
    kl_coef or reference; verl's own loss modes take none)."""
    from verl.workers.config import ActorConfig

    from rpg.loss_config import RPGPolicyLossConfig

    return ActorConfig(strategy=strategy, rollout_n=1, ppo_micro_batch_size_per_gpu=micro, clip_ratio_low=low,
                       clip_ratio_high=high, clip_ratio_c=c, loss_agg_mode=agg,
                       policy_loss=RPGPolicyLossConfig(loss_mode=loss_mode, **policy))  # fmt: skip
