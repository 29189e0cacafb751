"""The ref_log_prob adapter (rpg/reference/adapter.py): through verl's real `ppo_loss`, and its installation. ~15 s.

Inside a registered policy loss, `current_ref_log_prob()` must return the `ref_log_prob` verl shipped, padded like the
loss's `log_prob`; it is None without a reference model and outside `ppo_loss`. With the top-k hook installed too, the
one wrapper of `ppo_loss` gives the loss both pieces' terms in one micro-batch record. Installing the adapter and the
worker hooks must patch verl's objects once, keeping verl's `@register` dispatch metadata (when they are installed at
all is tests/test_scoped_patches_on_cpu.py; every selection, tests/test_patches_on_cpu.py).
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tensordict import TensorDict
from verl.trainer.ppo import core_algos
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig, PolicyLossConfig
from verl.workers.utils import losses
from verl.workers.utils.padding import left_right_2_no_padding

from rpg import install, topk_hook
from rpg.reference import adapter, step

PROBE = "rpg_test_reference_probe"
PROMPT_W, RESP_W = 4, 5
PROMPT_LENS, RESP_LENS = [4, 2, 3], [5, 3, 1]


@pytest.fixture()
def probe():
    """A registered policy loss that records what it sees: (log_prob, current_ref_log_prob())."""
    seen = []

    @core_algos.register_policy_loss(PROBE)
    def probe_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
        seen.append((log_prob.detach().clone(), adapter.current_ref_log_prob()))
        return (log_prob * response_mask).sum() * 0.0, {}

    install.install([install.REF_LOG_PROB])
    yield seen
    core_algos.POLICY_LOSS_REGISTRY.pop(PROBE, None)


def make_data(ref_layout):
    """verl's no-padding micro-batch as `ppo_loss` receives it; `ref_layout` in {None, "padded", "nested"}."""
    g = torch.Generator().manual_seed(0)
    bs = len(PROMPT_LENS)
    attn = torch.zeros(bs, PROMPT_W + RESP_W, dtype=torch.long)
    resp_mask = torch.zeros(bs, RESP_W, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESP_LENS)):
        attn[i, PROMPT_W - p : PROMPT_W + r] = 1
        resp_mask[i, :r] = 1
    ids = torch.randint(3, 40, attn.shape, generator=g) * attn
    ref = -torch.rand(bs, RESP_W, generator=g) - 0.1  # distinct, non-zero everywhere (also on padding)
    fields = {
        "input_ids": ids, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp_min(0),
        "prompts": ids[:, :PROMPT_W], "responses": ids[:, PROMPT_W:], "response_mask": resp_mask,
        "old_log_probs": -torch.rand(bs, RESP_W, generator=g), "advantages": torch.randn(bs, RESP_W, generator=g),
    }
    if ref_layout == "padded":
        fields["ref_log_prob"] = ref
    td = left_right_2_no_padding(TensorDict(fields, batch_size=[bs]))
    if ref_layout == "nested":  # the layout the v1 trainer's TransferQueue path delivers
        rows = [ref[i][resp_mask[i].bool()] for i in range(bs)]
        td["ref_log_prob"] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    # flat per-token model output over prompt+response; response token j sits at position PROMPT_W - 1 + j
    lp = -torch.rand(bs, PROMPT_W + RESP_W, generator=g)
    return td, lp[attn.bool()], ref, resp_mask.bool()


def actor_config(use_kl_loss):
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, use_kl_loss=use_kl_loss,
                       kl_loss_coef=0.0, kl_loss_type="k1", policy_loss=PolicyLossConfig(loss_mode=PROBE))


@pytest.mark.parametrize("layout", ["padded", "nested"])
def test_registered_loss_sees_the_shipped_ref_log_prob(probe, layout):
    td, flat_lp, ref, mask = make_data(layout)
    loss, metrics = losses.ppo_loss(actor_config(True), {"log_probs": flat_lp}, td)
    assert len(probe) == 1
    log_prob, seen_ref = probe[0]
    assert seen_ref is not None and seen_ref.shape == log_prob.shape == (len(PROMPT_LENS), RESP_W)
    expected = ref if layout == "padded" else ref * mask  # verl pads nested tensors with 0, as it does old_log_prob
    torch.testing.assert_close(seen_ref, expected, rtol=0, atol=0)
    assert not seen_ref.requires_grad
    # aligned with log_prob: verl's own k1 KL on the same micro-batch equals mean(log_prob - ref) over valid tokens
    assert float(metrics["kl_loss"].aggregate()) == pytest.approx(((log_prob - seen_ref)[mask]).mean().item(),
                                                                  rel=1e-6)
    assert adapter.current_ref_log_prob() is None  # reset after the call


def test_none_without_reference_model(probe):
    td, flat_lp, _, _ = make_data(None)
    losses.ppo_loss(actor_config(False), {"log_probs": flat_lp}, td)
    assert probe[0][1] is None


def test_reset_even_when_the_loss_raises(probe):
    td, flat_lp, _, _ = make_data("padded")

    @core_algos.register_policy_loss(PROBE)
    def failing(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
        assert adapter.current_ref_log_prob() is not None
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        losses.ppo_loss(actor_config(True), {"log_probs": flat_lp}, td)
    assert adapter.current_ref_log_prob() is None


def test_the_steps_reference_kl_matches_the_formula(probe):
    """The KL the periodic schedule measures inside ppo_loss (the training step's reference-KL sum): token mean of
    w·k3(π_ref/π_θ) (paper §2.2; docs/losses.md#grpo-kl); nothing is measured outside a step or when no mode asks."""
    td, flat_lp, ref, mask = make_data("padded")
    losses.ppo_loss(actor_config(True), {"log_probs": flat_lp}, td)  # outside a training step: nothing to add to
    with step.running(step.TrainingStep(measure_ref_kl=False)) as unmeasured:
        losses.ppo_loss(actor_config(True), {"log_probs": flat_lp}, td)
    assert unmeasured.sums() == [0.0, 0.0, 0.0, 0.0]
    with step.running(step.TrainingStep(measure_ref_kl=True)) as measured:
        losses.ppo_loss(actor_config(True), {"log_probs": flat_lp}, td)
    kl_sum, tokens, loss_kl, loss_tokens = measured.sums()
    assert (loss_kl, loss_tokens) == (0.0, 0.0)  # the probe loss reports no divergence of its own
    lp = probe[0][0].double()
    old, r = td["old_log_probs"].double(), ref.double()
    per_token = torch.exp(lp - old) * (torch.exp(r - lp) - (r - lp) - 1)
    assert tokens == mask.sum().item()
    assert kl_sum == pytest.approx(per_token[mask].sum().item(), rel=1e-12)
    assert kl_sum > 0
    # identical policy and reference -> zero KL
    kl, n = adapter.token_kl_to_reference(lp, old, lp, mask)
    assert (kl.item(), n.item()) == (0.0, float(mask.sum()))


def test_one_wrapper_gives_the_loss_both_pieces_terms(probe):
    """ref_log_prob and topk_kl both hook ppo_loss: one wrapper, one record, both terms inside the loss."""
    td, flat_lp, ref, mask = make_data("padded")
    kl = torch.rand(flat_lp.shape, generator=torch.Generator().manual_seed(2))
    model_output = {"log_probs": flat_lp, topk_hook.KL: kl, topk_hook.IN_SUPPORT: torch.ones_like(kl)}
    seen_topk = []
    core_algos.register_policy_loss(PROBE)(_recording(probe, seen_topk))
    install.install([install.TOPK_KL])
    try:
        losses.ppo_loss(actor_config(True), model_output, td)
    finally:
        install.uninstall([install.TOPK_KL])
    (_, seen_ref), (terms,) = probe[0], seen_topk
    torch.testing.assert_close(seen_ref, ref, rtol=0, atol=0)
    assert terms is not None and terms.kl.shape == seen_ref.shape and bool(terms.in_support[mask].all())
    assert adapter.current_ref_log_prob() is None and topk_hook.current() is None


def _recording(seen, seen_topk):
    def probe_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
        seen.append((log_prob.detach().clone(), adapter.current_ref_log_prob()))
        seen_topk.append(topk_hook.current())
        return (log_prob * response_mask).sum() * 0.0, {}

    return probe_loss


_INSTALL_CHECK = textwrap.dedent(
    """
    import sys
    from rpg import install, patches
    from verl.single_controller.base.decorator import MAGIC_ATTR
    install.install(["ref_log_prob", "worker_hooks"]); install.install(["ref_log_prob", "worker_hooks"])
    import verl.workers.engine_workers as ew
    import verl.workers.utils.losses as L
    for module in (L, ew):
        patch = patches.patch_of(module.ppo_loss)
        assert patch is not None and patches.patch_of(module.ppo_loss.__wrapped__) is None, "not wrapped once"
        assert module.ppo_loss.__wrapped__ is patch.original and set(patch.pieces) == {"ref_log_prob"}
    assert install.installed("ref_log_prob") and install.installed("worker_hooks")
    cls = ew.ActorRolloutRefWorker
    for name in ("update_actor", "save_checkpoint", "load_checkpoint"):
        fn = cls.__dict__[name]
        assert patches.patch_of(fn) and patches.patch_of(fn.__wrapped__) is None, name
        assert getattr(fn, MAGIC_ATTR) == getattr(fn.__wrapped__, MAGIC_ATTR), name + " lost verl's dispatch info"
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("rpg")], sys.meta_path
    print("OK")
    """
)


def test_install_patches_verl_once_keeping_its_dispatch_metadata():
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    out = subprocess.run([sys.executable, "-c", _INSTALL_CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]
