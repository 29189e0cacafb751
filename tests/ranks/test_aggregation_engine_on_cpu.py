"""2 gloo ranks × 2 micro-batches through verl 0.9.1's FSDP2 engine: the first update's gradient is the one-piece one.

Two spawned ranks (tests/ranks/rank_pool.py) each build verl's real `ActorRolloutRefWorker` (role `actor`, FSDP2,
fp32) and run `update_actor` on their half of one 8-sequence mini-batch with `ppo_micro_batch_size_per_gpu=2`, i.e.
2 micro-batches per rank, exactly as verl's trainer drives it (`global_batch_size` = `mini_batch_size` = 8; the
engine all-reduces `batch_num_tokens` and sets `dp_size`; FSDP2 averages the gradients over the ranks). The gradient
the engine holds at its first optimizer step (gathered from the DTensor shards, before clipping) must equal the
gradient of the same loss computed here in one piece: the plain transformers model with the same initial weights,
the whole mini-batch in one call of verl's `ppo_loss` (float32, 1e-5 relative). Losses: RPG-RKL (fully
differentiable) and RPG-REINFORCE-URKL, with the recipes' `loss_agg_mode=token-mean` (β = 0.2, so the KL term
matters; π_old is the model's own log-probs perturbed so that every dual-clip branch occurs). The sequences differ in
length by up to 9×, so a loss that ignored `global_batch_info` would fail (see tests/ranks/test_aggregation_on_cpu.py
for every aggregation mode in-process, and the report for the mutation run).

Cost: one 2-rank pool start-up shared with tests/ranks/test_two_ranks_engine_on_cpu.py, ~10 s per loss.
"""

from __future__ import annotations

import pytest
import torch

from engine_scenarios import first_update_gradient, padded_batch, to_td

N, MICRO = 8, 2
LOSSES = ["rpg_rkl", "rpg_reinforce_urkl"]
KL_COEF = 0.2


@pytest.fixture(scope="module")
def batch_and_model(tiny_qwen2_dir):
    """The mini-batch (π_old = the initial model's log-probs ± up to 0.8) and the plain HF model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_qwen2_dir, attn_implementation="eager", torch_dtype=torch.float32
    )
    batch = padded_batch(N, seed=5)  # response tokens: 15 on rank 0, 26 on rank 1; micro-batches 9, 6 | 18, 8
    with torch.no_grad():
        current = response_log_probs(model, batch)
    g = torch.Generator().manual_seed(3)
    batch["old_log_probs"] = (current + 0.8 * (2 * torch.rand(current.shape, generator=g) - 1)) * batch["response_mask"]
    return batch, model


def response_log_probs(model, batch) -> torch.Tensor:
    """(n, RESPONSE_W) log π(response token) from the left/right-padded batch, as verl's actor computes them."""
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    logits = model(**inputs).logits.float()
    width = batch["prompts"].shape[1]
    lp = torch.log_softmax(logits[:, width - 1 : -1], -1)
    return lp.gather(-1, batch["responses"][..., None]).squeeze(-1) * batch["response_mask"]


def one_piece_gradient(model, batch, loss_mode: str) -> dict[str, torch.Tensor]:
    """∇ of verl's `ppo_loss` over the whole mini-batch in one call (one rank, one micro-batch)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    from verl_batch import actor_config, to_flat

    cfg = actor_config(loss_mode, strategy="fsdp2", c=3.0, micro=N, kl_coef=KL_COEF)
    td = to_td(batch)
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    model.zero_grad()
    flat = to_flat(response_log_probs(model, batch), batch["attention_mask"].bool(), batch["prompts"].shape[1])
    loss, _ = ppo_loss(cfg, {"log_probs": flat}, td)
    loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("loss_mode", LOSSES)
def test_two_ranks_two_micro_batches_give_the_one_piece_gradient(two_ranks, tiny_qwen2_dir, batch_and_model,
                                                                loss_mode):
    batch, model = batch_and_model
    settings = dict(loss_mode=loss_mode, agg="token-mean", micro=MICRO, kl_coef=KL_COEF)
    results = two_ranks.run(first_update_gradient, model_dir=tiny_qwen2_dir, batch=batch, **settings)
    total_tokens = int(batch["response_mask"].sum())
    for rank, result in enumerate(results):
        assert result["loss_calls"] == 2, f"rank {rank}: {result['loss_calls']} micro-batches, expected 2"
        for info in result["global_batch_info"]:  # what the engine and trainer handed to the loss
            assert (info["dp_size"], info["batch_num_tokens"], info["global_batch_size"]) == (2, total_tokens, N)
    engine = results[0]["grads"]
    reference = one_piece_gradient(model, batch, loss_mode)
    assert engine.keys() == reference.keys()
    flat_engine = torch.cat([engine[k].flatten() for k in sorted(engine)])
    flat_ref = torch.cat([reference[k].flatten() for k in sorted(reference)])
    assert flat_ref.norm() > 1e-3
    rel = float((flat_engine - flat_ref).norm() / flat_ref.norm())
    assert rel < 1e-5, f"{loss_mode}: relative gradient error {rel:.2e}"
    for name in reference:  # and per tensor, elementwise
        torch.testing.assert_close(engine[name], reference[name], rtol=1e-5, atol=1e-5 * float(flat_ref.abs().max()))
