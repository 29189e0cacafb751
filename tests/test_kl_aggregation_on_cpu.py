"""Which aggregation keeps an RPG KL exact when the response length is random (docs/losses.md#kl-aggregation), by exact
enumeration in float64 over a toy with an end-of-sequence symbol (`kl_toy.EOSToy`: 15 responses of 1–3 tokens).

For a batch of B responses drawn from π_old, the expected gradient of the KL part of the loss is computed exactly:
every multiset of B responses is one batch, weighted by its probability (`kl_toy.multisets`). Token credit targets
∇ of the per-token objective, sequence credit ∇ of the divergence between whole responses (frozen reference, ρ ≠ 1).

* token-sum, seq-mean-token-sum and seq-mean-token-sum-norm with a fixed scale: exact to 1e-10 (B = 1, 2), for the
  add-on's KL term and for the RPG losses (fully differentiable, and Algorithm 2 with C_KL at the raw ratio, no clip);
* the add-on over a seq-mean-token-mean base aggregates its KL with the constant denominator B·loss_scale_factor
  (seq-mean-token-sum-norm): exact to 1e-10 too; the mutants that keep the base's seq-mean-token-mean (a gap that does
  not shrink with B) or aggregate it token-mean (the batch's token count: a gap at every finite B) fail the check;
* token-mean (the paper recipes'): the relative gap to the B → ∞ limit falls like 1/B at B = 1, 2, 3;
* the add-on's loss value changes only for a seq-mean-token-mean base; the launcher and the loss itself (a plain
  verl launch) refuse the aggregations that make an RPG KL inexact, with one message.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from kl_toy import EOSToy, multisets
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss
from verl_batch import actor_config

import rpg.kl_addon
import rpg.reference
from rpg.divergences import DIVERGENCES
from rpg.kl_aggregation import addon_kl_agg_mode, aggregation_problem, rule_kl_aggregation
from rpg.loss_table import ADDON, loss_spec
from rpg_oracles import DIVS

pytestmark = pytest.mark.usefixtures("ref_log_prob_adapter")

DOC = Path(__file__).resolve().parents[1] / "docs" / "losses.md"
WIDE = dict(low=0.999, high=1e6, c=1e7)  # no clip active anywhere
SCALE = 3.0  # the fixed loss_scale_factor of seq-mean-token-sum-norm (= S, the toy's max_response_length)
SCALED = ("seq-mean-token-sum-norm", "seq-mean-token-mean")  # the add-on's KL over both: B·S


@pytest.fixture(scope="module")
def toy():
    toy = EOSToy(seed=1)
    assert sorted(set(toy.lengths.tolist())) == [1, 2, 3]
    return toy


def batch_info(mode):
    return {"loss_scale_factor": SCALE} if mode in SCALED else {}


def expected(toy, per_batch, size):
    """Σ over batches of `size` responses of P(batch)·per_batch(rows) (a differentiable scalar)."""
    p = toy.sequence_probs(toy.old)
    total = torch.zeros((), dtype=torch.float64)
    for rows, count in multisets(len(toy.seqs), size):
        idx = torch.tensor(rows)
        total = total + count * p[idx].prod() * per_batch(idx)
    return total


def addon_gradient(toy, div, credit, mode, size):
    """E_old[∇ aggregate_kl(β·K)] over batches of `size` responses, β = 1, the add-on's own aggregation."""
    th = toy.theta.clone().requires_grad_(True)
    log_prob, old, ref = toy.token_log_probs(th), toy.token_log_probs(toy.old), toy.token_log_probs(toy.ref)
    term = rpg.kl_addon.kl_term(log_prob, old, toy.mask, DIVERGENCES[div], 1.0, ref, credit)
    loss = expected(toy, lambda i: rpg.kl_addon.aggregate_kl(term.loss[i], toy.mask[i], mode, batch_info(mode)), size)
    (g,) = torch.autograd.grad(loss, th)
    return g


def scale_of(mode, size):
    """E[∇L] = ∇J / scale_of(mode, B) for the exact modes."""
    return {"token-sum": 1.0 / size, "seq-mean-token-sum": 1.0, "seq-mean-token-sum-norm": SCALE,
            "seq-mean-token-mean": SCALE}[mode]  # the last: the add-on's KL (seq-mean-token-sum-norm over it)


def gap(got, want):
    """|got − c·want| / |c·want| for the c nearest got (how far got is from any multiple of want)."""
    c = (got * want).sum() / (want * want).sum()
    return float((got - c * want).norm() / (c * want).norm())


CASES = [(div, credit) for div in DIVS for credit in ("token", "sequence")]


def assert_exact(toy, div, credit, modes):
    """E[∇L_B] = ∇J / scale_of(mode, B) to 1e-10 at B = 1, 2, for the add-on's KL over a base of each mode."""
    want = toy.grad(credit, div, toy.ref)
    assert want.abs().max() > 1e-2
    for mode in modes:
        for size in (1, 2):
            got = addon_gradient(toy, div, credit, mode, size)
            err = (got - want / scale_of(mode, size)).abs().max()
            assert err < 1e-10, (mode, size, err)


@pytest.mark.parametrize("div,credit", CASES)
def test_constant_denominators_are_exact(toy, div, credit):
    modes = ("token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")
    assert_exact(toy, div, credit, modes)


def token_mean_gaps(toy, div, credit, base_mode):
    """The relative gap of E[∇L_B] to ∇J / E|y| (B → ∞) at B = 1, 2, 3."""
    want = toy.grad(credit, div, toy.ref) / (toy.sequence_probs(toy.old) * toy.lengths).sum()
    return [float((addon_gradient(toy, div, credit, base_mode, b) - want).norm() / want.norm()) for b in (1, 2, 3)]


@pytest.mark.parametrize("div,credit", [("urkl", "token"), ("fkl", "sequence")])
def test_token_mean_is_exact_up_to_one_over_b(toy, div, credit):
    gaps = token_mean_gaps(toy, div, credit, "token-mean")
    assert gaps[0] > 0.02, gaps  # B = 1: the gap is real (token-mean is seq-mean-token-mean there)
    for b, g in zip((2, 3), gaps[1:]):
        assert 0.6 < g * b / gaps[0] < 1.25, (b, gaps)  # ~ gap_1 / B
    if (div, credit) == ("urkl", "token"):  # the numbers docs/losses.md quotes
        quoted = f"{gaps[0]:.0%} at B = 1, {gaps[1]:.0%} at B = 2 and {gaps[2]:.1%} at B = 3"
        assert quoted in " ".join(DOC.read_text().split()), quoted


@pytest.mark.parametrize("div,credit", [("rkl", "sequence")])
def test_mutant_seq_mean_token_mean_kl_fails(toy, div, credit, monkeypatch):
    """Aggregating the add-on's KL with the base's seq-mean-token-mean: E[∇L] is no multiple of ∇J, for every B."""
    monkeypatch.setattr(rpg.kl_addon, "addon_kl_agg_mode", lambda mode: mode)
    want = toy.grad(credit, div, toy.ref)
    gaps = [gap(addon_gradient(toy, div, credit, "seq-mean-token-mean", b), want) for b in (1, 2)]
    assert min(gaps) > 0.05 and abs(gaps[1] - gaps[0]) < 1e-9, gaps  # a bias that does not shrink with B
    with pytest.raises(AssertionError):
        assert_exact(toy, div, credit, ("seq-mean-token-mean",))


@pytest.mark.parametrize("div,credit", [("urkl", "token"), ("fkl", "sequence")])
def test_mutant_token_mean_over_seq_mean_token_mean_fails(toy, div, credit, monkeypatch):
    """The add-on's KL over a seq-mean-token-mean base aggregated token-mean (the batch's token count, a random
    denominator): a gap at B = 1 and 2, so the exactness check fails."""
    monkeypatch.setattr(rpg.kl_addon, "addon_kl_agg_mode", lambda mode: "token-mean")
    want = toy.grad(credit, div, toy.ref)
    assert min(gap(addon_gradient(toy, div, credit, "seq-mean-token-mean", b), want) for b in (1, 2)) > 0.01
    with pytest.raises(AssertionError):
        assert_exact(toy, div, credit, ("seq-mean-token-mean",))


# ---------------------------------------------------------------------------------------------------------------
# the RPG losses (their KL inside the one aggregated loss, A = 0): exact in the constant-denominator modes
# ---------------------------------------------------------------------------------------------------------------
def rpg_loss_gradient(toy, name, mode, size, **policy):
    cfg = actor_config(name, agg=mode, kl_coef=1.0, reference="frozen", **WIDE, **policy)
    if mode == "seq-mean-token-sum-norm":
        cfg.global_batch_info["loss_scale_factor"] = SCALE
    th = toy.theta.clone().requires_grad_(True)
    log_prob, old, ref = toy.token_log_probs(th), toy.token_log_probs(toy.old), toy.token_log_probs(toy.ref)
    fn = POLICY_LOSS_REGISTRY[name]

    def per_batch(i):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: ref[i])
            return fn(old[i], log_prob[i], toy.adv[i], toy.mask[i], mode, cfg, None)[0]

    (g,) = torch.autograd.grad(expected(toy, per_batch, size), th)
    return g


SEQUENCE_RAW = {"kl_ratio": "raw", "kl_credit": "sequence"}
RPG_ROWS = [
    ("rpg_urkl", "token", {}),
    ("rpg_fkl", "token", {}),
    ("rpg_reinforce_urkl", "token", {"kl_ratio": "raw"}),
    ("rpg_reinforce_urkl", "sequence", SEQUENCE_RAW),
    ("rpg_reinforce_ufkl", "sequence", SEQUENCE_RAW),
]


@pytest.mark.parametrize("name,credit,policy", RPG_ROWS)
def test_rpg_losses_are_exact_with_a_constant_denominator(toy, name, credit, policy):
    want = toy.grad(credit, name.rsplit("_", 1)[1], toy.ref)
    for mode in ("token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        got = rpg_loss_gradient(toy, name, mode, 1, **policy)
        assert (got - want / scale_of(mode, 1)).abs().max() < 1e-10, mode
    # token-mean at B = 1 is seq-mean-token-mean: a real gap (O(1/B) above), refused for seq-mean-token-mean itself
    got = rpg_loss_gradient(toy, name, "token-mean", 1, **policy)
    assert gap(got, want) > 0.02


# ---------------------------------------------------------------------------------------------------------------
# values: only a seq-mean-token-mean base changes; the rules
# ---------------------------------------------------------------------------------------------------------------
def test_addon_value_changes_only_for_a_seq_mean_token_mean_base(toy):
    th = toy.theta.clone()
    log_prob, old = toy.token_log_probs(th), toy.token_log_probs(toy.old)
    adv = torch.randn(toy.adv.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * toy.mask
    for mode in ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"):
        cfg = actor_config("rpg_kl_urkl", agg=mode, kl_coef=0.3, base_loss_mode="vanilla")
        cfg.global_batch_info["loss_scale_factor"] = SCALE  # read by the add-on's KL over seq-mean-token-mean only
        got = POLICY_LOSS_REGISTRY["rpg_kl_urkl"](old, log_prob, adv, toy.mask, mode, cfg, None)[0]
        base = POLICY_LOSS_REGISTRY["vanilla"](old, log_prob, adv, toy.mask, mode, cfg, None)[0]
        term = rpg.kl_addon.kl_term(log_prob, old, toy.mask, DIVERGENCES["urkl"], 0.3)
        kl_mode = "seq-mean-token-sum-norm" if mode == "seq-mean-token-mean" else mode
        kl = agg_loss(term.loss, toy.mask, kl_mode, loss_scale_factor=SCALE)
        assert torch.allclose(got, base + kl, rtol=1e-13, atol=0), mode
        if mode == "seq-mean-token-mean":
            assert not torch.allclose(kl, agg_loss(term.loss, toy.mask, mode))
    modes = ("token-mean", "seq-mean-token-mean", "token-sum")
    assert [addon_kl_agg_mode(m) for m in modes] == ["token-mean", "seq-mean-token-sum-norm", "token-sum"]


NEEDS_SCALE = "loss_scale_factor=<data.max_response_length>"
REFUSALS = [
    ("seq-mean-token-mean", None, False, "1/|y|"),
    ("seq-mean-token-mean", 4096, False, "1/|y|"),
    ("seq-mean-token-mean", None, True, NEEDS_SCALE),
    ("seq-mean-token-mean", 4096, True, None),
    ("seq-mean-token-sum-norm", None, True, NEEDS_SCALE),
    ("seq-mean-token-sum-norm", None, False, NEEDS_SCALE),
    ("seq-mean-token-sum-norm", 4096, False, None),
    ("token-mean", None, False, None),
]


@pytest.mark.parametrize("mode,scale,addon,refused", REFUSALS)
def test_inexact_aggregations_are_refused_with_the_fix(mode, scale, addon, refused):
    problem = aggregation_problem("rpg_kl_urkl" if addon else "rpg_urkl", addon, mode, scale)
    assert (problem is None) if refused is None else (refused in problem and "Fix:" in problem), problem


@pytest.mark.parametrize("mode,scale,addon,refused", REFUSALS)
def test_the_loss_refuses_them_too_with_the_launchers_message(toy, mode, scale, addon, refused):
    """A plain `python -m verl.trainer.main_ppo` run has no launcher: the RPG loss itself raises, with the message of
    the launcher's rule (`rule_kl_aggregation` over the composed config)."""
    name = "rpg_kl_urkl" if addon else "rpg_urkl"
    base = {"base_loss_mode": "vanilla"} if addon else {}
    cfg = actor_config(name, agg=mode, kl_coef=0.1, reference="frozen", **base)
    cfg.global_batch_info["loss_scale_factor"] = scale
    actor = {"loss_agg_mode": mode, "loss_scale_factor": scale}
    launcher = rule_kl_aggregation(OmegaConf.create({"actor_rollout_ref": {"actor": actor}}),
                                   SimpleNamespace(loss_mode=name, spec=loss_spec(name)))
    assert (launcher is None) == (refused is None) and (loss_spec(name).family == ADDON) == addon, launcher
    log_prob, old, ref = toy.token_log_probs(toy.theta), toy.token_log_probs(toy.old), toy.token_log_probs(toy.ref)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: ref)
        call = lambda: POLICY_LOSS_REGISTRY[name](old, log_prob, toy.adv, toy.mask, mode, cfg, None)  # noqa: E731
        if refused is None:
            assert torch.isfinite(call()[0])
        else:
            with pytest.raises(ValueError) as raised:
                call()
            assert str(raised.value) == launcher
