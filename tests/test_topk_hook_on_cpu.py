"""The top-k KL's engine hook (rpg/topk_hook.py, docs/losses.md#topk-kl).

* Unit, no model: for both of verl's padding layouts (packed with a trailing pad and a temperature, or padded
  (bsz, L, V)), the hook's per-token KL equals `rpg.topk_kl.topk_kl` on the same temperature-scaled logits flattened
  independently here, the gradient reaches the logits of the real rows only, and 1[y ∈ S] reads the next token.
* Through verl's real fused worker (tiny random Qwen2, FSDP2, CPU platform, the iterative reference): the old-log-prob
  pass returns the support (sorted, and where the sampled token is in it, its log-prob is verl's own `log_probs`:
  the rows are aligned), the update trains with it and logs finite `actor/rpg/topk_kl` and `actor/rpg/kl_share`;
  without the support in the batch the update stops with the fix. About 15 s.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rpg import topk_hook, topk_kl
from rpg.reference import micro_batch
from rpg.topk_hook import TopKUpdate

V, K = 11, 3


def _micro_batch(lengths, seed, remove_padding, train=TopKUpdate("reverse", "sampled")):
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    ids = torch.randint(0, V, (total,), generator=g)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    support = topk_kl.select_support(torch.randn(total, V, generator=g, dtype=torch.float64), K)
    nested = lambda x: torch.nested.nested_tensor_from_jagged(x, offsets)  # noqa: E731
    fields = {"input_ids": nested(ids), topk_hook.IDS: nested(support.ids),
              topk_hook.LOG_PROBS: nested(support.log_probs.float())}
    td = TensorDict(fields, batch_size=[len(lengths)])
    tu.assign_non_tensor(td, use_remove_padding=remove_padding, **{topk_hook.TRAIN: train})
    return td, ids, support


@pytest.mark.parametrize("remove_padding", [True, False])
@pytest.mark.parametrize("train", [TopKUpdate("reverse", "sampled"), TopKUpdate("forward", "bucket")])
def test_the_hooks_kl_is_topk_kl_on_the_scaled_logits_of_the_real_rows(remove_padding, train):
    lengths, pad, temperature = [3, 5, 2], 2, 0.7
    td, ids, support = _micro_batch(lengths, 0, remove_padding, train)
    g = torch.Generator().manual_seed(1)
    total = sum(lengths)
    rolled = torch.roll(ids, -1)
    if remove_padding:
        logits = torch.randn(1, total + pad, V, generator=g, requires_grad=True)
        args = {"temperature_is_one": False, "temperature_rmpad": torch.full((total + pad,), temperature),
                "input_ids_rmpad_rolled": torch.cat([rolled, torch.zeros(pad, dtype=torch.long)]), "pad_size": pad}
        rows = logits[0, :total]
    else:
        logits = torch.randn(len(lengths), max(lengths), V, generator=g, requires_grad=True)
        args = {"temperature_is_one": False, "temperature": torch.full((len(lengths),), temperature),
                "input_ids_rmpad_rolled": rolled}
        rows = torch.cat([logits[i, :n] for i, n in enumerate(lengths)])
    out = topk_hook.topk_outputs(SimpleNamespace(logits=logits), args, td)
    direction, tail = train.direction, train.tail  # typed fields of the batch's request, not a joined string
    at_support = topk_kl.Support(support.ids, support.log_probs.float())
    terms = topk_kl.topk_kl(rows / temperature, at_support, direction, tail, with_sum_sq=True)
    expected = terms.kl
    got = out[topk_hook.KL].values()
    # the KL share's moments: the closed form on them is kl_share on the independently flattened rows
    moments = topk_kl.ShareMoments(*(out[key].values() for key in topk_hook.SHARE))
    adv, lp_y = torch.randn(total, generator=g), torch.log_softmax(rows.detach() / temperature, -1)[range(total), rolled]
    inside, valid = topk_kl.in_support(support.ids, rolled), torch.ones(total, dtype=torch.bool)
    old = lp_y + 0.1
    share = topk_kl.kl_share_from_moments(moments, direction, tail, 0.5, adv, lp_y, inside, valid, old)
    want = topk_kl.kl_share(terms, 0.5, adv, lp_y, inside, valid, old)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(share, want)) and share.kl_grad_norm.sum() > 0
    assert got.shape == (total,) and torch.allclose(got, expected, atol=1e-6)
    assert torch.equal(out[topk_hook.IN_SUPPORT].values().bool(), topk_kl.in_support(support.ids, rolled))
    (grad,) = torch.autograd.grad(got.sum(), logits)
    (want,) = torch.autograd.grad(expected.sum(), logits)
    assert torch.allclose(grad, want, atol=1e-6) and grad.abs().sum() > 0
    if remove_padding:
        assert grad[0, total:].abs().sum() == 0  # the packed pad gets nothing
    else:
        assert all(grad[i, n:].abs().sum() == 0 for i, n in enumerate(lengths))


def test_a_batch_without_the_hooks_keys_is_left_alone():
    from tensordict import TensorDict

    td = TensorDict({"input_ids": torch.nested.nested_tensor_from_jagged(torch.zeros(3, dtype=torch.long),
                                                                         torch.tensor([0, 3]))}, batch_size=[1])
    assert topk_hook.topk_outputs(SimpleNamespace(logits=None), {}, td) == {}


REQUESTS = [
    ("compute_log_prob", "iterative", (topk_hook.SELECT, 4)),
    ("compute_ref_log_prob", "iterative", None),
    ("compute_log_prob", "frozen", None),
    ("compute_ref_log_prob", "frozen", (topk_hook.SELECT, 4)),
    ("update_actor", "frozen", (topk_hook.TRAIN, TopKUpdate("reverse", "bucket"))),
]


@pytest.mark.parametrize("method, reference, expected", REQUESTS)
def test_the_reference_pass_selects_and_the_update_trains(method, reference, expected):
    from rpg.loss_config import RPGPolicyLossConfig

    settings = RPGPolicyLossConfig(
        loss_mode="rpg_kl_urkl", kl_estimator="topk", kl_topk=4, kl_topk_tail="bucket", reference=reference
    )
    assert topk_hook.request_for(settings, method) == expected
    assert topk_hook.request_for(RPGPolicyLossConfig(loss_mode="rpg_kl_urkl"), method) is None
    fkl = RPGPolicyLossConfig(loss_mode="rpg_fkl", kl_estimator="topk")
    assert topk_hook.request_for(fkl, "update_actor") == (topk_hook.TRAIN, TopKUpdate("forward", "sampled"))
    wk3 = RPGPolicyLossConfig(loss_mode="grpo_wk3", kl_estimator="topk", kl_topk=4)  # its KL is to π_ref, always
    wk3_requests = {"compute_log_prob": None, "update_actor": (topk_hook.TRAIN, TopKUpdate("reverse", "sampled"))}
    assert topk_hook.request_for(wk3, method) == wk3_requests.get(method, (topk_hook.SELECT, 4))


# ---- verl's fused worker ----------------------------------------------------------------------------------------------
PROMPTS = [[5, 6, 7, 9], [11, 9], [3, 4, 5, 6, 7, 8, 9], [20, 21, 22]]


@pytest.fixture(scope="module")
def worker(tiny_qwen2_dir):
    from cpu_worker import fused_worker_builder

    from rpg import install

    overrides = [
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_urkl",
        "+actor_rollout_ref.actor.policy_loss.kl_coef=0.1",
        "+actor_rollout_ref.actor.policy_loss.branch_on=advantage",
        "+actor_rollout_ref.actor.policy_loss.kl_estimator=topk", "+actor_rollout_ref.actor.policy_loss.kl_topk=5",
        "+actor_rollout_ref.actor.policy_loss.kl_credit=sequence",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=1",
    ]
    return fused_worker_builder(tiny_qwen2_dir, overrides, installs=(install.TOPK_KL,))()


def _batch():
    from cpu_worker import token_batch

    g = torch.Generator().manual_seed(7)
    responses = [torch.randint(3, 48, (n,), generator=g).tolist() for n in (3, 5, 1, 4)]
    return token_batch(PROMPTS, responses, [1.0, -1.0, 0.5, -0.5])


def test_the_worker_selects_the_support_and_trains_with_it(worker):
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    td, mask = _batch()
    out = worker.compute_log_prob(td.clone())
    ids, lps, lp = out[topk_hook.IDS], out[topk_hook.LOG_PROBS], out["log_probs"]
    assert ids.values().dtype == torch.int32 and ids.values().shape == (lp.values().shape[0], 5)
    vals = lps.values()
    assert torch.all(vals[:, :-1] >= vals[:, 1:]) and torch.all(torch.logsumexp(vals, -1) <= 1e-6)
    labels = torch.roll(td["input_ids"].values(), -1)  # the next token of every packed row (verl's labels)
    hit = (ids.values().long() == labels[:, None])
    rows = hit.any(-1)
    assert rows.any()
    assert torch.allclose(vals[hit], lp.values()[rows], atol=1e-5)  # the support's rows are verl's log-prob rows

    old = no_padding_2_padding(lp, td).detach()
    td["old_log_probs"] = old * mask
    td[topk_hook.IDS], td[topk_hook.LOG_PROBS] = ids, lps
    update = {"global_batch_size": 2, "mini_batch_size": 2, "epochs": 1, "seed": 0}
    tu.assign_non_tensor(td, compute_loss=True, dataloader_kwargs={"shuffle": False}, **update)
    metrics = tu.get(worker.update_actor(td.clone()), "metrics")
    kl = metrics["actor/rpg/topk_kl"]
    assert len(kl) == 2 and all(torch.isfinite(torch.tensor(v)) and v >= -1e-6 for v in kl)  # on-policy first step
    assert all(torch.isfinite(torch.tensor(v)).all() for k, v in metrics.items() if k.startswith("actor/rpg/"))
    assert len(metrics["actor/rpg/kl_share"]) == 2 and all(0 < v < 1 for v in metrics["actor/rpg/kl_share"])

    missing = td.clone()
    del missing[topk_hook.IDS]
    with pytest.raises(RuntimeError, match="found no support"):
        worker.update_actor(missing)


# ---- the loss: the reward part with β = 0 plus β·(analytic + tail), outside the clip ---------------------------------
WAYS = [("rpg_urkl", "reverse"), ("rpg_reinforce_hardclip_ufkl", "forward"), ("rpg_kl_rkl", "reverse")]


@pytest.mark.parametrize("loss_mode, way", WAYS)
@pytest.mark.parametrize("tail", ["sampled", "bucket"])
def test_the_loss_adds_beta_times_the_topk_kl_and_its_sampled_tail(loss_mode, way, tail):
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
    from verl_batch import actor_config

    import rpg.verl_plugin  # noqa: F401  (registers the RPG losses)

    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    old = torch.randn(2, 4, generator=g).clamp(max=-0.1)
    log_prob = (old + 0.3 * torch.randn(2, 4, generator=g)).requires_grad_()
    adv = torch.tensor([[1.0], [-0.5]]).expand(2, 4) * mask
    kl = torch.rand(2, 4, generator=g).requires_grad_()
    in_support = torch.tensor([[True, False, True, False], [False, True, True, True]])
    beta = 0.3
    config = actor_config(loss_mode, kl_coef=beta, kl_estimator="topk", kl_topk_tail=tail)
    plain = actor_config(loss_mode, kl_coef=0.0)
    with micro_batch.opened(micro_batch.MicroBatch(topk=topk_hook.TopKTerms(kl, in_support))):
        got, metrics = get_policy_loss_fn(loss_mode)(old, log_prob, adv, mask, "token-mean", config, None)
    assert topk_hook.current() is None
    reward, _ = get_policy_loss_fn(loss_mode)(old, log_prob, adv, mask, "token-mean", plain, None)
    log_w = log_prob - old
    sampled = (torch.exp(log_w) * log_w if way == "reverse" else -log_w) * (~in_support)
    total = kl + (sampled if tail == "sampled" else 0.0)
    expected = reward + agg_loss(loss_mat=beta * total * mask, loss_mask=mask, loss_agg_mode="token-mean")
    assert torch.allclose(got, expected, atol=1e-6)
    g_got = torch.autograd.grad(got, [log_prob, kl])
    g_want = torch.autograd.grad(expected, [log_prob, kl])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_got, g_want))
    assert g_got[1][~mask].abs().sum() == 0 and g_got[1][mask].abs().min() > 0  # the analytic part: β, not β·w
    assert metrics["actor/rpg/topk_kl"] == pytest.approx((total * mask).sum().item() / mask.sum().item(), rel=1e-5)


def test_the_kl_share_metric_is_the_kl_terms_share_of_both_gradient_norms():
    from rpg.topk_kl import KLShare
    from rpg.topk_loss import TopKLoss, topk_metrics

    mask = torch.tensor([[True, True, False]])
    kl = torch.tensor([[0.2, 0.4, 9.0]])
    share = KLShare(torch.tensor([0.1, 0.3, 0.0], dtype=torch.float64), torch.tensor([0.6, 1.0, 0.0], dtype=torch.float64))
    metrics = topk_metrics(TopKLoss(kl, kl, share), mask)
    assert metrics == pytest.approx({"actor/rpg/topk_kl": 0.3, "actor/rpg/kl_share": 0.4 / 2.0})
    zero_adv = KLShare(share.kl_grad_norm, torch.zeros(3, dtype=torch.float64))
    assert topk_metrics(TopKLoss(kl, kl, zero_adv), mask)["actor/rpg/kl_share"] == 1.0  # A = 0: all of it is the KL
    nothing = KLShare(torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    assert topk_metrics(TopKLoss(kl, kl, nothing), mask)["actor/rpg/kl_share"] == 0.0
    assert topk_metrics(TopKLoss(kl, kl, None), mask) == pytest.approx({"actor/rpg/topk_kl": 0.3})


def test_a_changed_verl_signature_is_refused_and_nothing_is_patched(monkeypatch):
    import verl.workers.engine.fsdp.transformer_impl as engine
    import verl.workers.utils.losses as losses

    from rpg import install

    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func, extra):
        return {}

    def ppo_loss(config, model_output, data, dp_group=None):
        return None

    monkeypatch.setattr(engine.FSDPEngineWithLMHead, "prepare_model_outputs", prepare_model_outputs)
    monkeypatch.setattr(losses, "ppo_loss", ppo_loss)
    changed = r"prepare_model_outputs\('self', 'output', 'output_args', 'micro_batch', 'logits_processor_func', 'extra'\)"
    with pytest.raises(RuntimeError, match=changed):
        install.install([install.TOPK_KL])
    assert engine.FSDPEngineWithLMHead.prepare_model_outputs is prepare_model_outputs and losses.ppo_loss is ppo_loss
