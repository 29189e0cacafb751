"""The exact KL add-on over verl's losses (`rpg_kl_<div>`), sequence-level credit and multi-turn masks, by exact
enumeration in float64 (docs/losses.md#kl-addon, #kl-credit, #multi-turn).

* every usable base: at β = 0 the add-on is the base (loss, gradient); at β > 0 the extra expected gradient over
  π_old is β·∇D of the per-token objective (token credit) or of the sequence-level divergence (sequence credit),
  iterative and frozen reference (ρ ≠ 1); the checks fail when the token ratio is replaced by the sequence ratio or
  dropped (mutation tests);
* token credit differs from sequence credit by exactly β·(∇D_seq − ∇D_tok) of the enumeration;
* the REINFORCE families with sequence credit are exact too;
* RPG-<DIV> = the add-on over `vanilla`;
* a response with an observation span (response_mask 0 inside it) = the same response with the span cut out.

Expectations are exact: every response of the toy is one row, the rollout-correction weight of row y is π_old(y),
and the aggregation is `token-sum`, so the KL term of the loss is Σ_y π_old(y)·Σ_t K_t(y).
"""

from __future__ import annotations

import pytest
import torch
from kl_toy import REVERSE, ARToy
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss
from verl_batch import actor_config

import rpg.kl_addon
import rpg.reference.adapter
from rpg.divergences import DIVERGENCES
from rpg.loss_table import ADDON_BASES
from rpg_oracles import DIVS

pytestmark = pytest.mark.usefixtures("ref_log_prob_adapter")  # losses with a reference, in-process

BETA = 0.3
WIDE = dict(low=0.999, high=1e6, c=1e7)  # no clip active anywhere
BASE_OPTIONS = {"dro": {"dro_beta": 0.1}}
SCALE = 7  # loss_scale_factor (the batches' width T)


def cfg_for(name, base="vanilla", beta=BETA, reference="iterative", agg="token-sum", clip=None, **policy):
    clip = clip or dict(low=0.2, high=0.28, c=3.0)
    if name.startswith("rpg_kl_"):
        policy = {"base_loss_mode": base, **BASE_OPTIONS.get(base, {}), **policy}
    cfg = actor_config(name, agg=agg, kl_coef=beta, reference=reference, **clip, **policy)
    cfg.global_batch_info["loss_scale_factor"] = SCALE  # the add-on's constant denominator over seq-mean-token-mean
    return cfg


def call(name, cfg, old, log_prob, adv, mask, weights=None, ref=None, agg=None, seed=0):
    """(loss, d loss/d log_prob, metrics) of a registered loss; `ref` is the shipped ref_log_prob."""
    lp = log_prob.detach().clone().requires_grad_(True)
    torch.manual_seed(seed)  # clip_cov's random token selection
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: ref)
        loss, metrics = POLICY_LOSS_REGISTRY[name](old, lp, adv, mask, agg or cfg.loss_agg_mode, cfg, weights)
    (g,) = torch.autograd.grad(loss, lp, allow_unused=True)
    return loss.detach(), (torch.zeros_like(lp) if g is None else g), metrics


def random_batch(seed, bs=6, T=7, padded=True):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, T, generator=g, dtype=torch.float64) * 2 - 0.05
    log_prob = old + 0.5 * torch.randn(bs, T, generator=g, dtype=torch.float64)
    ref = old + 0.4 * torch.randn(bs, T, generator=g, dtype=torch.float64)
    lens = torch.randint(2, T + 1, (bs,), generator=g) if padded else torch.full((bs,), T)
    mask = torch.arange(T).unsqueeze(0) < lens.unsqueeze(1)
    adv = (torch.randn(bs, 1, generator=g, dtype=torch.float64) * mask).expand(bs, T).clone() * mask
    weights = torch.rand(bs, T, generator=g, dtype=torch.float64) + 0.5
    return old, log_prob, adv, mask, ref, weights


# ---------------------------------------------------------------------------------------------------------------
# β = 0: the add-on is the base, called as verl calls it
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ADDON_BASES)
def test_zero_beta_is_the_base_loss(base):
    old, log_prob, adv, mask, ref, weights = random_batch(1)
    for agg in ("token-mean", "seq-mean-token-mean"):
        cfg = cfg_for("rpg_kl_urkl", base, beta=0.0, agg=agg)
        got = call("rpg_kl_urkl", cfg, old, log_prob, adv, mask, weights)
        want = call(base, cfg, old, log_prob, adv, mask, weights)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (base, agg)
        assert set(want[2]) <= set(got[2])  # the base's metrics are kept


# ---------------------------------------------------------------------------------------------------------------
# β > 0: the extra expected gradient is β·∇D (token and sequence credit, ρ = 1 and ρ ≠ 1)
# ---------------------------------------------------------------------------------------------------------------
def extra_gradient(toy, name, base, reference, credit, clip=None):
    """∇_θ of (add-on − base) in expectation over π_old: Σ_y π_old(y)·Σ_t K_t(y), exactly."""
    th = toy.theta.clone().requires_grad_(True)
    log_prob = toy.token_log_probs(th)
    old = toy.token_log_probs(toy.old)
    ref = toy.token_log_probs(toy.ref) if reference != "iterative" else None
    v = toy.sequence_probs(toy.old).unsqueeze(1).expand(-1, toy.S).clone()
    cfg = cfg_for(name, base, reference=reference, kl_credit=credit, clip=clip)
    _, g_addon, metrics = call(name, cfg, old, log_prob, toy.adv, toy.mask, v, ref)
    _, g_base, _ = call(base, cfg, old, log_prob, toy.adv, toy.mask, v, ref)
    (grad,) = torch.autograd.grad(log_prob, th, grad_outputs=g_addon - g_base)
    return grad, metrics


def target(toy, div, reference, objective):
    ref_logits = toy.old if reference == "iterative" else toy.ref
    return BETA * toy.grad(objective, div, ref_logits)


def credit_cases():
    for div in DIVS:
        for reference in ("iterative", "frozen"):
            for credit in ("token", "sequence"):
                if credit == "sequence" and reference == "iterative" and not REVERSE[div]:
                    continue  # refused: identical to token credit (test_forward_sequence_credit_is_refused_...)
                yield div, reference, credit


@pytest.mark.parametrize("div,reference,credit", list(credit_cases()))
@pytest.mark.parametrize("on_policy", [False, True])
def test_extra_gradient_is_beta_grad_d_for_every_base(div, reference, credit, on_policy):
    toy = ARToy(seed=3, steps=3, vocab=2, on_policy=on_policy)
    want = target(toy, div, reference, credit)
    assert want.abs().max() > 1e-3 or (on_policy and reference == "iterative")  # there θ = θ_old = θ_ref: ∇D = 0
    for base in ADDON_BASES:
        got, metrics = extra_gradient(toy, f"rpg_kl_{div}", base, reference, credit)
        assert (got - want).abs().max() < 1e-10, (div, base, reference, credit, (got - want).abs().max())
    assert torch.isfinite(torch.tensor(list(metrics.values()))).all() and "actor/rpg/kl" in metrics


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("reference", ["iterative", "frozen"])
def test_token_and_sequence_credit_differ_by_what_the_enumeration_predicts(div, reference):
    """Sequence − token estimator = β·(∇D_seq − ∇D_tok) exactly, and that difference is not small (except for a
    forward divergence against π_ref = π_old, where the two objectives have the same gradient: refused)."""
    toy = ARToy(seed=5, steps=3, vocab=3)
    predicted = target(toy, div, reference, "sequence") - target(toy, div, reference, "token")
    if reference == "iterative" and not REVERSE[div]:
        assert predicted.abs().max() < 1e-12
        return
    assert predicted.abs().max() > 1e-3
    tok, _ = extra_gradient(toy, f"rpg_kl_{div}", "gspo", reference, "token")
    seq, _ = extra_gradient(toy, f"rpg_kl_{div}", "gspo", reference, "sequence")
    assert ((seq - tok) - predicted).abs().max() < 1e-10


def test_forward_sequence_credit_is_refused_with_the_iterative_reference():
    with pytest.raises(ValueError, match="kl_credit='sequence' has no effect"):
        cfg_for("rpg_kl_ufkl", kl_credit="sequence")
    cfg_for("rpg_kl_ufkl", reference="frozen", kl_credit="sequence")
    cfg_for("rpg_kl_urkl", kl_credit="sequence")


# ---- mutation tests: the checks fail when the token weight is the sequence ratio or is dropped ------------------
def _sequence_ratio(log_prob, old_log_prob, mask):
    """GSPO's sequence ratio per token: value (1/|y|)·Σ log w, gradient of the token's log π (TRL issue #6586)."""
    log_w = torch.where(mask, log_prob - old_log_prob.detach(), 0.0)
    seq = log_w.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(mask, log_prob - log_prob.detach() + seq.detach(), 0.0)


def _dropped_ratio(log_prob, old_log_prob, mask):
    """No importance weight: w = 1 in value (verl's use_kl_loss), gradient of log π."""
    return torch.where(mask, log_prob - log_prob.detach(), 0.0)


@pytest.mark.parametrize("mutant", [_sequence_ratio, _dropped_ratio])
@pytest.mark.parametrize("div", DIVS)
def test_checks_fail_with_a_sequence_ratio_or_no_weight(div, mutant, monkeypatch):
    """FKL's exact regulariser −ρ·log w has the gradient −ρ·∇log π whatever the value of w (C_KL = ρ): it carries no
    token weight, so the mutants leave it exact; every other row fails the check."""
    toy = ARToy(seed=7, steps=3, vocab=2)
    for reference in ("iterative", "frozen"):
        want = target(toy, div, reference, "token")
        for base in ("vanilla", "gspo"):
            assert (extra_gradient(toy, f"rpg_kl_{div}", base, reference, "token")[0] - want).abs().max() < 1e-10
    with monkeypatch.context() as mp:
        mp.setattr(rpg.kl_addon, "kl_log_ratio", mutant)
        errors = [
            (extra_gradient(toy, f"rpg_kl_{div}", base, reference, "token")[0]
             - target(toy, div, reference, "token")).abs().max().item()
            for base in ("vanilla", "gspo") for reference in ("iterative", "frozen")
        ]  # fmt: skip
    if div == "fkl":
        assert max(errors) < 1e-10, errors
    else:
        assert min(errors) > 1e-3, errors


# ---------------------------------------------------------------------------------------------------------------
# the REINFORCE families with sequence credit
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("div,reference,credit", list(credit_cases()))
@pytest.mark.parametrize("family", ["rpg_reinforce", "rpg_reinforce_hardclip"])
def test_reinforce_credit_is_exact(div, reference, credit, family):
    """A = 0, no clip active, C_KL at the raw ratio: Σ_y π_old(y)·∇loss_y = β·∇D (per-token or sequence-level)."""
    toy = ARToy(seed=9, steps=3, vocab=2)
    toy.adv.zero_()
    name = f"{family}_{div}"
    extra = {"kl_ratio": "raw"} if div != "fkl" else {}
    cfg = cfg_for(name, reference=reference, kl_credit=credit, clip=WIDE, **extra)
    th = toy.theta.clone().requires_grad_(True)
    log_prob = toy.token_log_probs(th)
    v = toy.sequence_probs(toy.old).unsqueeze(1).expand(-1, toy.S).clone()
    ref = toy.token_log_probs(toy.ref) if reference != "iterative" else None
    _, g, _ = call(name, cfg, toy.token_log_probs(toy.old), log_prob, toy.adv, toy.mask, v, ref)
    (got,) = torch.autograd.grad(log_prob, th, grad_outputs=g)
    want = target(toy, div, reference, credit)
    assert (got - want).abs().max() < 1e-10, (got - want).abs().max()


# ---------------------------------------------------------------------------------------------------------------
# RPG-<DIV> is the add-on over vanilla
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("reference", ["iterative", "frozen"])
def test_rpg_div_is_the_addon_over_vanilla(div, reference):
    old, log_prob, adv, mask, ref, weights = random_batch(4, bs=16, T=9)
    log_w = (log_prob - old)[mask]
    assert log_w.abs().max() < 20 and ((log_w.exp() < 0.8) | (log_w.exp() > 1.28)).any()  # clips active
    ref = ref if reference == "frozen" else None
    for agg in ("token-mean", "seq-mean-token-sum"):
        rpg = call(f"rpg_{div}", cfg_for(f"rpg_{div}", reference=reference, agg=agg), old, log_prob, adv, mask,
                   weights, ref)  # fmt: skip
        addon = call(f"rpg_kl_{div}", cfg_for(f"rpg_kl_{div}", reference=reference, agg=agg), old, log_prob, adv,
                     mask, weights, ref)  # fmt: skip
        assert torch.allclose(rpg[0], addon[0], rtol=1e-12, atol=1e-14)
        assert torch.allclose(rpg[1], addon[1], rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------------------------
# multi-turn: an observation span inside the response is skipped
# ---------------------------------------------------------------------------------------------------------------
SPAN = slice(2, 5)  # observation tokens of row 0 (response_mask 0 inside the response)


def with_span(seed, padded):
    """A batch whose row 0 has an observation span at SPAN (finite garbage there), and the same batch with the span
    cut out of row 0 (its tail shifted left, padded at the end). Returns both and the index map of row 0."""
    old, log_prob, adv, mask, ref, weights = random_batch(seed, bs=4, T=9, padded=padded)
    mask[0] = True
    mask[0, SPAN] = False
    keep = torch.nonzero(mask[0]).squeeze(1)
    cut = [t.clone() for t in (old, log_prob, adv, ref, weights)]
    cut_mask = mask.clone()
    n = keep.numel()
    for src, dst in zip((old, log_prob, adv, ref, weights), cut):
        dst[0, :n] = src[0, keep]
        dst[0, n:] = src[0, -1]
    cut_mask[0, :n], cut_mask[0, n:] = True, False
    garbage = torch.randn(3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 5 - 2
    for t in (old, log_prob, ref):
        t[0, SPAN] = garbage
    return (old, log_prob, adv, mask, ref, weights), (cut[0], cut[1], cut[2], cut_mask, cut[3], cut[4]), keep, n


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("credit", ["token", "sequence"])
@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_an_observation_span_is_the_same_as_cutting_it_out(padded, credit, agg):
    full, cut, keep, n = with_span(11, padded)
    names = [("rpg_kl_urkl", "gspo"), ("rpg_kl_rkl", "vanilla"), ("rpg_kl_ufkl", "cispo"), ("rpg_kl_fkl", "geo_mean"),
             ("rpg_reinforce_urkl", None), ("rpg_reinforce_hardclip_rkl", None)]  # fmt: skip
    for name, base in names:
        if agg == "seq-mean-token-mean" and base is None:
            continue  # refused for an RPG loss (tests/test_kl_aggregation_on_cpu.py)
        for reference in ("iterative", "frozen"):
            if credit == "sequence" and reference == "iterative" and not REVERSE[name.rsplit("_", 1)[1]]:
                continue
            cfg = cfg_for(name, base or "vanilla", reference=reference, agg=agg, kl_credit=credit)
            a = call(name, cfg, *full[:4], full[5], full[4] if reference == "frozen" else None)
            b = call(name, cfg, *cut[:4], cut[5], cut[4] if reference == "frozen" else None)
            assert torch.allclose(a[0], b[0], rtol=1e-12, atol=1e-14), (name, reference)
            assert torch.equal(a[1][0, SPAN], torch.zeros(3, dtype=torch.float64))
            assert torch.allclose(a[1][0, keep], b[1][0, :n], rtol=1e-12, atol=1e-14), (name, reference)
            assert torch.allclose(a[1][1:], b[1][1:], rtol=1e-12, atol=1e-14)
            for key in ("actor/rpg/kl", "actor/rpg/ratio_mean", "actor/rpg/kl_credit_abs"):
                if key in a[2]:
                    assert a[2][key] == pytest.approx(b[2][key], rel=1e-12), key


def test_no_padding_layout_through_verls_ppo_loss():
    """verl's no-padding layout with an observation span (attention 1, response_mask 0) reaches the add-on as the
    padded tensors the direct call gets."""
    from verl_batch import make_batch, to_flat
    from verl.workers.utils.losses import ppo_loss

    full, _, _, _ = with_span(12, padded=False)
    old, log_prob, adv, mask, _, _ = (t.float() if t.is_floating_point() else t for t in full)
    td, _, attn = make_batch([2, 4, 3, 1], [9, 9, 9, 9], response_width=9,
                             extra={"old_log_probs": old, "advantages": adv, "response_mask": mask.long()})
    cfg = cfg_for("rpg_kl_urkl", "gspo", agg="token-mean", kl_credit="sequence")
    flat = to_flat(log_prob, attn, 4).requires_grad_(True)
    loss, metrics = ppo_loss(cfg, {"log_probs": flat}, td)
    (g_flat,) = torch.autograd.grad(loss, flat)
    direct, g_direct, _ = call("rpg_kl_urkl", cfg, old, log_prob, adv, mask)
    assert torch.allclose(loss, direct, atol=1e-6)
    assert torch.allclose(to_flat(g_direct.float(), attn, 4), g_flat, atol=1e-6)
    assert "actor/rpg/kl_credit_abs" in metrics


# ---------------------------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base,why", [("bypass_mode", "legacy-trainer wrapper"), ("rpg_urkl", "its own KL"),
                                      ("rpg_kl_fkl", "its own KL"), ("nonsense", "choose one of")])
def test_unusable_bases_are_refused_with_the_reason(base, why):
    with pytest.raises(ValueError, match=why):
        cfg_for("rpg_kl_urkl", base)


def test_base_and_credit_options_are_refused_where_they_do_nothing():
    with pytest.raises(ValueError, match="base_loss_mode='gspo' has no effect"):
        cfg_for("rpg_urkl", base_loss_mode="gspo")
    with pytest.raises(ValueError, match="kl_credit='sequence' has no effect"):
        cfg_for("rpg_urkl", kl_credit="sequence")


def test_a_second_kl_beside_the_addon_is_refused_before_launch():
    """verl's KL loss with a non-zero coefficient or its in-reward KL next to the add-on; the base's clip fields."""
    from rpg.launch import RecipeConfigError, compose_and_validate

    pl = "actor_rollout_ref.actor.policy_loss."
    good = [
        "actor_rollout_ref.rollout.name=vllm", "algorithm.adv_estimator=grpo", f"{pl}_target_=rpg.RPGPolicyLossConfig",
        f"{pl}loss_mode=rpg_kl_urkl", f"+{pl}base_loss_mode=gspo", f"+{pl}kl_credit=sequence",
        "actor_rollout_ref.actor.clip_ratio_low=0.0003", "actor_rollout_ref.actor.clip_ratio_high=0.0004",
    ]  # fmt: skip
    assert compose_and_validate(good).rpg.base_loss_mode == "gspo"
    bad = {
        "kl_loss_coef=0.001": ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001"],
        "use_kl_in_reward=True": ["algorithm.use_kl_in_reward=True"],
        "clip_ratio_low=1.5": ["actor_rollout_ref.actor.clip_ratio_low=1.5"],
    }
    for needle, extra in bad.items():
        with pytest.raises(RecipeConfigError, match=needle.replace(".", r"\.")):
            compose_and_validate(good + extra)


def test_extreme_ratios_and_long_responses_stay_finite():
    g = torch.Generator().manual_seed(2)
    bs, T = 3, 400
    old = -torch.rand(bs, T, generator=g) * 3
    log_prob = old + 3.0 * torch.randn(bs, T, generator=g)
    log_prob[0, 5] = 1e4  # |log w| far beyond the guard
    ref = old - 2.0
    mask = torch.ones(bs, T, dtype=torch.bool)
    adv = torch.randn(bs, 1, generator=g).expand(bs, T).clone()
    for name in ("rpg_kl_urkl", "rpg_kl_rkl", "rpg_reinforce_urkl"):
        cfg = cfg_for(name, "cispo", reference="frozen", agg="token-mean", kl_credit="sequence")
        loss, grad, metrics = call(name, cfg, old, log_prob, adv, mask, None, ref)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), name
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), name


# ---------------------------------------------------------------------------------------------------------------
# The moving reference and β of docs/reference-modes.md#ema and docs/losses.md#adaptive-beta
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["vanilla", "gspo"])
def test_addon_with_an_ema_reference_and_an_adaptive_beta(base, monkeypatch):
    """ρ from an EMA reference reaches the add-on as from a frozen one (same ref_log_prob, same numbers), and with
    kl_control='adaptive' the add-on uses the controller's β of this training step (not kl_coef) and feeds the
    controller's KL estimate."""
    from rpg.reference.adaptive_kl import AdaptiveBeta, AdaptiveKLCoef
    from rpg.reference.step import TrainingStep, running

    # the EMA blend itself runs in verl's worker (the hooks RPG_INSTALL=worker_hooks installs; tests/ranks):
    # here the loss only reads the shipped ref_log_prob, as for `frozen`
    monkeypatch.setattr("rpg.losses.require", lambda settings: None)
    old, log_prob, adv, mask, ref, weights = random_batch(7)
    frozen = call("rpg_kl_urkl", cfg_for("rpg_kl_urkl", base, reference="frozen"), old, log_prob, adv, mask, ref=ref)
    ema = call("rpg_kl_urkl", cfg_for("rpg_kl_urkl", base, reference="ema"), old, log_prob, adv, mask, ref=ref)
    assert torch.equal(ema[0], frozen[0]) and torch.equal(ema[1], frozen[1])

    beta_now = 0.55  # the controller's value, ≠ kl_coef (BETA)
    fixed = call("rpg_kl_urkl", cfg_for("rpg_kl_urkl", base, beta=beta_now, reference="ema"), old, log_prob, adv,
                 mask, ref=ref)  # fmt: skip
    adaptive_cfg = cfg_for("rpg_kl_urkl", base, reference="ema", kl_control="adaptive", kl_target=0.01)
    controller = AdaptiveKLCoef(BETA, target=0.01, horizon=10.0)
    controller.value = beta_now
    with running(TrainingStep()) as step:  # as the worker hooks open it (rpg/reference/hooks.py)
        AdaptiveBeta(controller).start_step(step)
        got = call("rpg_kl_urkl", adaptive_cfg, old, log_prob, adv, mask, ref=ref)
    _, _, kl_sum, tokens = step.sums()
    assert torch.equal(got[0], fixed[0]) and torch.equal(got[1], fixed[1])
    assert not torch.equal(got[0], ema[0])  # β changed the loss: the check can fail
    assert tokens == mask.sum().item() and kl_sum / tokens == pytest.approx(got[2]["actor/rpg/kl"])


# ---------------------------------------------------------------------------------------------------------------
# the KL share of the sampled KL (docs/losses.md#sampled-share)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("credit", ["token", "sequence"])
def test_sampled_share_norms_are_the_kl_terms_own_gradient(div, credit):
    """|∂K_t/∂log π_θ(y_t)| by autograd of the KL term itself, times 1 − p_y; a ratio beyond the ±60 guard gets 0."""
    old, log_prob, adv, mask, ref, _ = random_batch(3)
    log_prob[0, 1] = old[0, 1] - 70.0  # beyond the guard: the clamp's gradient is 0 (and 1 − p_y ≈ 1)
    row = DIVERGENCES[div]
    lp = log_prob.clone().requires_grad_(True)
    term = rpg.kl_addon.kl_term(lp, old, mask, row, BETA, ref, credit)
    (c,) = torch.autograd.grad(term.loss.sum(), lp)
    kl_norm, adv_norm = rpg.kl_addon.sampled_share(term, row, BETA, adv, lp, old)
    n = (1 - log_prob.exp()).clamp(min=0)
    assert torch.allclose(kl_norm, torch.where(mask, c.abs() * n, 0.0), rtol=1e-12, atol=1e-14)
    assert torch.allclose(adv_norm, torch.where(mask, adv.abs() * n, 0.0), rtol=1e-12, atol=0)
    assert kl_norm[0, 1] == 0 and (kl_norm[mask] > 0).double().mean() > 0.8


@pytest.mark.parametrize("div", DIVS)
def test_sampled_share_is_exact_per_token_and_bounded_in_sum_against_the_logit_gradients(div):
    """With the full distribution: per token |c|/(|c| + |A|) = ‖∇_z K‖/(‖∇_z K‖ + |A|·‖e_y − p‖) (both along e_y − p),
    and 1 − p_y ≤ ‖e_y − p‖ ≤ √2·(1 − p_y), so each summed norm is within √2 of the exact one."""
    g = torch.Generator().manual_seed(5)
    bs, T, V = 4, 5, 6
    z = torch.randn(bs, T, V, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, V, (bs, T), generator=g)
    old, _, adv, mask, ref, _ = random_batch(4, bs, T)
    log_prob = torch.log_softmax(z, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    row = DIVERGENCES[div]
    term = rpg.kl_addon.kl_term(log_prob, old, mask, row, BETA, ref, "token")
    kl_norm, adv_norm = rpg.kl_addon.sampled_share(term, row, BETA, adv, log_prob, old)
    exact_kl, exact_adv = torch.zeros(bs, T, dtype=torch.float64), torch.zeros(bs, T, dtype=torch.float64)
    for b in range(bs):
        for t in range(T):
            if mask[b, t]:
                (gk,) = torch.autograd.grad(term.loss[b, t], z, retain_graph=True)
                (gr,) = torch.autograd.grad(log_prob[b, t], z, retain_graph=True)  # e_y − p at (b, t)
                exact_kl[b, t], exact_adv[b, t] = gk[b, t].norm(), adv[b, t].abs() * gr[b, t].norm()
    m = mask & (adv != 0)
    assert torch.allclose((kl_norm / (kl_norm + adv_norm))[m], (exact_kl / (exact_kl + exact_adv))[m], rtol=1e-10)
    for approx, exact in ((kl_norm, exact_kl), (adv_norm, exact_adv)):
        assert (approx <= exact * (1 + 1e-12)).all() and (exact <= approx * 2**0.5 * (1 + 1e-12)).all()


def test_the_addon_logs_the_sampled_share():
    old, log_prob, adv, mask, ref, weights = random_batch(6)
    cfg = cfg_for("rpg_kl_urkl", base="gspo", reference="frozen")
    _, _, metrics = call("rpg_kl_urkl", cfg, old, log_prob, adv, mask, weights, ref=ref)
    row = DIVERGENCES["urkl"]
    term = rpg.kl_addon.kl_term(log_prob, old, mask, row, BETA, ref, "token")
    kl_norm, adv_norm = rpg.kl_addon.sampled_share(term, row, BETA, adv, log_prob, old)
    expected = (kl_norm.sum() / (kl_norm.sum() + adv_norm.sum())).item()
    assert 0 < metrics["actor/rpg/kl_share"] < 1 and abs(metrics["actor/rpg/kl_share"] - expected) < 1e-12, metrics
