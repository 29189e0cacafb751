"""Loss-level tests: Algorithm 2's branch table, equivalences with verl's own dual-clip PPO, the registered
verl-signature functions (aggregation, TIS weights, metrics, numerics), and verl's real `ppo_loss` wiring."""

from __future__ import annotations

import math

import pytest
import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, compute_policy_loss_vanilla
from verl.workers.config import ActorConfig, PolicyLossConfig

import rpg.losses as L
from rpg.loss_config import RPGPolicyLossConfig
from rpg.divergences import DIVERGENCES
from rpg_oracles import DIVS, weight
from verl_batch import actor_config

pytestmark = pytest.mark.usefixtures("ref_log_prob_adapter")  # losses with a reference, in-process

RPG_NAMES = sorted(n for n, s in L.LOSSES.items() if s.family != L.ADDON)  # the add-on: test_kl_addon_on_cpu.py
# every verl mode an RPG loss accepts (seq-mean-token-mean is refused: tests/test_kl_aggregation_on_cpu.py); -norm with
# the fixed scale SCALE in verl's global batch information
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
SCALE = 7


def random_batch(seed=0, bs=8, T=12, spread=0.6, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, T, generator=g, dtype=dtype) * 3 - 0.05
    log_prob = (old + spread * torch.randn(bs, T, generator=g, dtype=dtype)).requires_grad_(True)
    adv = torch.randn(bs, 1, generator=g, dtype=dtype).expand(bs, T).clone()
    lengths = torch.randint(1, T + 1, (bs,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return old, log_prob, adv * mask, mask


# ---------------------------------------------------------------------------------------------------------------
# Algorithm 2 branch table (docs/losses.md#algorithm-2)
# ---------------------------------------------------------------------------------------------------------------
CLIP = L.ClipParams(0.2, 0.28, 10.0)
# ratios on both sides of 1−ε1, 1+ε2 and c, including the exact boundaries
RATIOS = [0.5, 0.8, 0.9, 1.0, 1.1, 1.28, 1.5, 5.0, 10.0, 20.0]


def expected_branch(w, a_eff):
    if a_eff >= 0:
        return ("grad", w) if w < 1.28 else ("flat", 1.28)
    if w <= 0.8:
        return ("flat", 0.8)
    if w < 10.0:
        return ("grad", w)
    return ("flat", 10.0)


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("kl_ratio", ["clipped", "raw"])
@pytest.mark.parametrize("adv_value", [1.0, -1.0, 0.0, 1e-6, -1e-6])
def test_algorithm2_branch_table(div, kl_ratio, adv_value):
    """Value and gradient of every token equal the branch table; tiny |A| makes A' and A disagree in sign."""
    beta = 0.05
    old = torch.full((1, len(RATIOS)), -2.0, dtype=torch.float64)
    log_prob = (old + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_(True)
    adv = torch.full_like(old, adv_value)
    mask = torch.ones_like(old, dtype=torch.bool)
    out = L.rpg_reinforce(log_prob, old, adv, mask, DIVERGENCES[div], beta, CLIP, kl_ratio=kl_ratio)
    (grad,) = torch.autograd.grad(out.loss.sum(), log_prob)
    for j, w in enumerate(RATIOS):
        w_kl = min(max(w, 0.8), 1.28) if kl_ratio == "clipped" else w
        c_kl = weight(div, torch.tensor(math.log(w_kl), dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64), beta).item()  # β·C_KL(w_kl)
        a_eff = adv_value + c_kl / w
        kind, w_used = expected_branch(w, a_eff)
        nll = 2.0 - math.log(w)
        assert out.loss[0, j].item() == pytest.approx((w_used * adv_value + c_kl) * nll, rel=1e-12, abs=1e-15)
        expected_grad = -(w * adv_value + c_kl) if kind == "grad" else 0.0
        assert grad[0, j].item() == pytest.approx(expected_grad, rel=1e-12, abs=1e-15), (w, kind)


def test_branch_on_advantage_reproduces_the_authors_sign_rule():
    """branch_on='advantage': A = 0 goes to the negative branch (authors' `advantages > 0`), A' decides otherwise."""
    old = torch.full((1, 2), -1.0, dtype=torch.float64)
    log_prob = (old + math.log(0.5)).requires_grad_(True)  # w = 0.5 < 1 − ε1
    adv = torch.zeros_like(old)
    mask = torch.ones_like(old, dtype=torch.bool)
    fkl = DIVERGENCES["fkl"]  # C_KL = +β > 0 ⇒ A' > 0 ⇒ positive branch (gradient flows at w = 0.5)
    paper = L.rpg_reinforce(log_prob, old, adv, mask, fkl, 0.1, CLIP)
    authors = L.rpg_reinforce(log_prob, old, adv, mask, fkl, 0.1, CLIP, branch_on="advantage")
    assert (paper.branch == L.POS_GRAD).all() and (authors.branch == L.NEG_FLAT_LOW).all()
    (g_paper,) = torch.autograd.grad(paper.loss.sum(), log_prob)
    (g_auth,) = torch.autograd.grad(authors.loss.sum(), log_prob)
    assert torch.allclose(g_paper, torch.full_like(g_paper, -0.1)) and (g_auth == 0).all()


# ---------------------------------------------------------------------------------------------------------------
# equivalences with verl's own dual-clip PPO (compute_policy_loss_vanilla)
# ---------------------------------------------------------------------------------------------------------------
def _vanilla(old, log_prob, adv, mask, cfg):
    lp = log_prob.detach().clone().requires_grad_(True)
    loss, _ = compute_policy_loss_vanilla(old, lp, adv, mask, "token-mean", cfg)
    (g,) = torch.autograd.grad(loss, lp)
    return loss, g


def _registered(name, old, log_prob, adv, mask, cfg, agg="token-mean", weights=None):
    lp = log_prob.detach().clone().requires_grad_(True)
    loss, metrics = POLICY_LOSS_REGISTRY[name](old, lp, adv, mask, agg, cfg, weights)
    (g,) = torch.autograd.grad(loss, lp)
    return loss, g, metrics


@pytest.mark.parametrize("div", DIVS)
def test_fd_with_zero_beta_is_verls_dual_clip_ppo(div):
    old, log_prob, adv, mask = random_batch(1, spread=1.0)
    cfg = actor_config(f"rpg_{div}", kl_coef=0.0)
    v_loss, v_grad = _vanilla(old, log_prob, adv, mask, cfg)
    loss, grad, _ = _registered(f"rpg_{div}", old, log_prob, adv, mask, cfg)
    assert torch.allclose(loss, v_loss, rtol=1e-12, atol=1e-14) and torch.allclose(grad, v_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_reinforce_has_the_gradient_of_dual_clip_ppo_on_the_effective_advantage(div, beta):
    """Algorithm 2 ≡ verl's dual-clip PPO with the detached A' = A + C/w (β = 0: plain PPO on A);
    docs/losses.md#equivalence-with-dual-clip-ppo."""
    old, log_prob, adv, mask = random_batch(2, spread=1.2)
    cfg = actor_config(f"rpg_reinforce_{div}", kl_coef=beta)
    _, grad, _ = _registered(f"rpg_reinforce_{div}", old, log_prob, adv, mask, cfg)
    out = L.rpg_reinforce(log_prob, old, adv, mask, DIVERGENCES[div], beta, CLIP)
    _, v_grad = _vanilla(old, log_prob, (adv + out.kl_adv) * mask, mask, cfg)
    assert torch.allclose(grad, v_grad, rtol=1e-10, atol=1e-14)
    assert ((out.branch == L.POS_FLAT_HIGH) | (out.branch == L.NEG_FLAT_LOW))[mask].any()  # clipped tokens exist


@pytest.mark.parametrize("div", ["rkl", "ufkl", "urkl"])
def test_kl_clamp_reproduces_the_authors_clamp(div):
    """kl_clamp=10 zeroes the KL gradient where the surrogate saturates (docs/differences.md#d3); FKL is never
    clamped."""
    old = torch.full((1, 2), -3.0, dtype=torch.float64)
    log_prob = (old + torch.tensor([[3.5, 0.1]], dtype=torch.float64)).requires_grad_(True)  # w ≈ 33 saturates
    mask = torch.ones_like(old, dtype=torch.bool)
    adv = torch.zeros_like(old)
    clamped = L.rpg_fully_differentiable(log_prob, old, adv, mask, DIVERGENCES[div], 1.0, CLIP, kl_clamp=10.0)
    (g,) = torch.autograd.grad(clamped.loss.sum(), log_prob)
    assert g[0, 0] == 0 and g[0, 1] != 0 and clamped.loss[0, 0].item() == pytest.approx(10.0)
    free = L.rpg_fully_differentiable(log_prob, old, adv, mask, DIVERGENCES[div], 1.0, CLIP)
    (g_free,) = torch.autograd.grad(free.loss.sum(), log_prob)
    assert g_free[0, 0] != 0 and g_free[0, 1] == g[0, 1]
    fkl = L.rpg_fully_differentiable(log_prob, old, adv, mask, DIVERGENCES["fkl"], 1.0, CLIP, kl_clamp=0.5)
    assert fkl.loss[0, 0].item() == pytest.approx(-3.5)


# ---------------------------------------------------------------------------------------------------------------
# registered functions: aggregation, TIS weights, metrics, numerics
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in RPG_NAMES if n != "grpo_wk3"])
def test_registered_loss_aggregates_with_verls_agg_loss(name):
    family, div = L.LOSSES[name].family, L.LOSSES[name].divergence
    old, log_prob, adv, mask = random_batch(3)
    cfg = actor_config(name, kl_coef=0.01)
    cfg.global_batch_info["loss_scale_factor"] = SCALE
    for agg in AGG_MODES:
        loss, _, _ = _registered(name, old, log_prob, adv, mask, cfg, agg=agg)
        if family == "fd":
            mat = L.rpg_fully_differentiable(log_prob, old, adv, mask, div, 0.01, CLIP).loss
        else:
            mat = L.rpg_reinforce(log_prob, old, adv, mask, div, 0.01, CLIP, hard_clip=family == "hardclip").loss
        assert torch.allclose(loss, agg_loss(mat, mask, agg, loss_scale_factor=SCALE), rtol=1e-12)


@pytest.mark.parametrize("name", ["rpg_urkl", "rpg_reinforce_ufkl", "rpg_reinforce_hardclip_rkl"])
def test_rollout_is_weights_multiply_the_per_token_loss(name):
    old, log_prob, adv, mask = random_batch(4)
    cfg = actor_config(name, kl_coef=0.05)
    tis = torch.rand(old.shape, generator=torch.Generator().manual_seed(9), dtype=old.dtype) * 2
    tis_garbage = torch.where(mask, tis, torch.nan)  # padding must not leak
    loss_w, g_w, _ = _registered(name, old, log_prob, adv, mask, cfg, weights=tis_garbage)
    lp = log_prob.detach().clone().requires_grad_(True)
    family, div = L.LOSSES[name].family, L.LOSSES[name].divergence
    if family == "fd":
        mat = L.rpg_fully_differentiable(lp, old, adv, mask, div, 0.05, CLIP).loss
    else:
        mat = L.rpg_reinforce(lp, old, adv, mask, div, 0.05, CLIP, hard_clip=family == "hardclip").loss
    manual = agg_loss(mat * tis * mask, mask, "token-mean")
    (g_manual,) = torch.autograd.grad(manual, lp)
    assert torch.allclose(loss_w, manual) and torch.allclose(g_w, g_manual)
    loss_2, _, _ = _registered(name, old, log_prob, adv, mask, cfg, weights=torch.full_like(old, 2.0))
    loss_1, _, _ = _registered(name, old, log_prob, adv, mask, cfg)
    assert torch.allclose(loss_2, 2 * loss_1)


def _garbage_batch(extreme):
    old, log_prob, adv, mask = random_batch(5, dtype=torch.float32)
    with torch.no_grad():
        log_prob = (old + extreme * torch.sign(torch.randn_like(old))).requires_grad_(True)
    old = torch.where(mask, old, torch.tensor(float("nan")))
    old[~mask & (torch.arange(old.shape[1]) % 2 == 0)] = float("inf")
    lp = torch.where(mask, log_prob.detach(), torch.tensor(float("-inf"))).requires_grad_(True)
    adv = torch.where(mask, adv, torch.tensor(float("nan")))
    return old, lp, adv, mask


@pytest.mark.parametrize("name", RPG_NAMES)
@pytest.mark.parametrize("extreme", [0.0, 20.0, 50.0, 1e4])
def test_extreme_ratios_and_padding_garbage_stay_finite(name, extreme, monkeypatch):
    """|log w| up to 50 (and far beyond) and NaN/±inf in padded positions: finite loss, gradient and metrics."""
    old, lp, adv, mask = _garbage_batch(extreme)
    if L.LOSSES[name].needs_reference:  # grpo_wk3 needs ref log-probs
        ref = torch.where(mask, old - 1.0, torch.tensor(float("nan")))
        monkeypatch.setattr("rpg.reference.adapter.current_ref_log_prob", lambda: ref, raising=False)
    cfg = actor_config(name, kl_coef=1e-4)
    cfg.global_batch_info["loss_scale_factor"] = SCALE
    for agg in AGG_MODES:
        lp_ = lp.detach().clone().requires_grad_(True)
        loss, metrics = POLICY_LOSS_REGISTRY[name](old, lp_, adv, mask, agg, cfg, None)
        (g,) = torch.autograd.grad(loss, lp_)
        assert torch.isfinite(loss), (agg, loss)
        assert torch.isfinite(g).all() and (g[~mask] == 0).all(), agg
        assert all(math.isfinite(v) for v in metrics.values()), metrics


def test_metrics_are_a_researchers_dashboard():
    old, log_prob, adv, mask = random_batch(6, spread=1.0)
    cfg = actor_config("rpg_reinforce_urkl", kl_coef=0.01)
    _, _, m = _registered("rpg_reinforce_urkl", old, log_prob, adv, mask, cfg)
    fracs = [m[f"actor/rpg/frac_{b}"] for b in L.BRANCHES]
    assert sum(fracs) == pytest.approx(1.0) and min(fracs) >= 0
    w = (log_prob - old).exp()[mask]
    assert m["actor/rpg/ratio_max"] == pytest.approx(w.max().item())
    assert m["actor/rpg/ratio_min"] == pytest.approx(w.min().item())
    assert m["actor/rpg/ratio_mean"] == pytest.approx(w.mean().item())
    assert m["actor/ppo_kl"] == pytest.approx((old - log_prob)[mask].mean().item())
    wd, lwd = w.detach(), (log_prob - old)[mask].detach()
    assert m["actor/rpg/kl"] == pytest.approx((wd * lwd - wd + 1).mean().item())  # URKL estimate of KL(π_θ‖π_old)
    assert m["actor/rpg/kl_adv_abs"] == pytest.approx((0.01 * (wd.clamp(0.8, 1.28) * wd.clamp(0.8, 1.28).log()) / wd).abs().mean().item())
    assert m["actor/rpg/kl_adv_rel"] == pytest.approx(m["actor/rpg/kl_adv_abs"] / adv[mask].abs().mean().item())
    assert m["actor/pg_clipfrac"] == pytest.approx(m["actor/rpg/frac_pos_flat_high"] + m["actor/rpg/frac_neg_flat_low"])


# ---------------------------------------------------------------------------------------------------------------
# configuration errors
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"kl_coef": float("nan")}, "kl_coef"),
        ({"kl_clamp": 0.0}, "kl_clamp"),
        ({"branch_on": "A'"}, "effective_advantage"),
        ({"kl_ratio": "w"}, "clipped"),
        ({"kl_placement": "inside"}, "inside_clip"),
        ({"reference": "polyak"}, "ema"),
        ({"reference": "periodic"}, "ref_refresh_steps"),
        ({"ref_refresh_steps": -2}, "ref_refresh_steps"),
        ({"ref_kl_ema": 1.0}, "ref_kl_ema"),
    ],
)
def test_config_rejects_bad_values_with_the_valid_choices(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RPGPolicyLossConfig(loss_mode="rpg_urkl", **kwargs)


def test_plain_policy_loss_config_is_refused_with_the_fix():
    old, log_prob, adv, mask = random_batch(0)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2,
                      policy_loss=PolicyLossConfig(loss_mode="rpg_urkl"))  # fmt: skip
    with pytest.raises(ValueError, match=r"policy_loss._target_=rpg.RPGPolicyLossConfig"):
        POLICY_LOSS_REGISTRY["rpg_urkl"](old, log_prob, adv, mask, "token-mean", cfg, None)


def test_bypass_mode_is_refused():
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    with pytest.raises(ValueError, match="bypass_mode"):
        RPGPolicyLossConfig(loss_mode="rpg_urkl", rollout_correction=RolloutCorrectionConfig(bypass_mode=True))


@pytest.mark.parametrize("field, value, match", [("clip_ratio_c", 1.0, "clip_ratio_c"), ("clip_ratio_low", 1.2, "clip_ratio_low")])
def test_bad_clip_ratios_are_refused(field, value, match):
    old, log_prob, adv, mask = random_batch(0)
    kwargs = {"low": 0.2, "high": 0.28, "c": 10.0}
    kwargs[{"clip_ratio_c": "c", "clip_ratio_low": "low"}[field]] = value
    with pytest.raises(ValueError, match=match):
        POLICY_LOSS_REGISTRY["rpg_reinforce_urkl"](old, log_prob, adv, mask, "token-mean", actor_config(**kwargs), None)


def test_mapping_policy_loss_config_is_accepted_and_validated():
    old, log_prob, adv, mask = random_batch(0)
    good = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0,
            "policy_loss": {"loss_mode": "rpg_rkl", "kl_coef": 0.1}}  # fmt: skip
    loss, _ = POLICY_LOSS_REGISTRY["rpg_rkl"](old, log_prob, adv, mask, "token-mean", good, None)
    assert torch.isfinite(loss)
    bad = dict(good, policy_loss={"loss_mode": "rpg_rkl", "kl_coeff": 0.1})
    with pytest.raises(ValueError, match="kl_coeff"):
        POLICY_LOSS_REGISTRY["rpg_rkl"](old, log_prob, adv, mask, "token-mean", bad, None)


# ---------------------------------------------------------------------------------------------------------------
# through verl's real ppo_loss wrapper (verl/workers/utils/losses.py)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rpg_ufkl", "rpg_reinforce_urkl"])
def test_through_verls_ppo_loss(name):
    from verl_batch import make_batch, to_flat
    from verl.workers.utils.losses import ppo_loss

    prompt_lens, response_lens = [2, 4, 3], [5, 1, 3]
    old, log_prob, adv, mask = random_batch(8, bs=3, T=5, dtype=torch.float32)
    mask = torch.arange(5).unsqueeze(0) < torch.tensor(response_lens).unsqueeze(1)
    adv = adv * mask
    td, response_mask, attn = make_batch(
        prompt_lens, response_lens, extra={"old_log_probs": old, "advantages": adv}
    )
    assert torch.equal(response_mask, mask)
    cfg = actor_config(name, kl_coef=0.02)
    flat = to_flat(log_prob.detach(), attn, 4).requires_grad_(True)
    loss, metrics = ppo_loss(cfg, {"log_probs": flat}, td)
    (g_flat,) = torch.autograd.grad(loss, flat)
    direct, g_direct, _ = _registered(name, old, log_prob, adv, mask, cfg)
    assert torch.allclose(loss, direct, atol=1e-6)
    assert torch.allclose(to_flat(g_direct.float(), attn, 4), g_flat, atol=1e-6)
    assert {"actor/pg_loss", "actor/rpg/kl", "actor/rpg/frac_pos_grad"} <= set(metrics)


# ---------------------------------------------------------------------------------------------------------------
# non-iterative references reach the loss through rpg.reference.adapter.current_ref_log_prob
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rpg_ufkl", "rpg_reinforce_rkl", "grpo_wk3"])
def test_frozen_reference_uses_the_shipped_ref_log_prob(name, monkeypatch):
    import rpg.reference.adapter

    old, log_prob, adv, mask = random_batch(12)
    ref = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1), dtype=old.dtype)
    monkeypatch.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: ref)
    cfg = actor_config(name, kl_coef=0.1, reference="frozen")
    loss, grad, metrics = _registered(name, old, log_prob, adv, mask, cfg)
    family, div = L.LOSSES[name].family, L.LOSSES[name].divergence
    lp = log_prob.detach().clone().requires_grad_(True)
    if family == "fd":
        mat = L.rpg_fully_differentiable(lp, old, adv, mask, div, 0.1, CLIP, ref_log_prob=ref).loss
    else:
        mat = L.rpg_reinforce(lp, old, adv, mask, div, 0.1, CLIP, ref_log_prob=ref).loss
    expected = agg_loss(mat, mask, "token-mean")
    assert torch.allclose(loss, expected) and torch.allclose(grad, torch.autograd.grad(expected, lp)[0])
    iterative, _, _ = _registered(name.replace("grpo_wk3", "rpg_urkl"), old, log_prob, adv, mask,
                                  actor_config(name.replace("grpo_wk3", "rpg_urkl"), kl_coef=0.1))  # fmt: skip
    assert not torch.allclose(loss, iterative)  # ρ ≠ 1 really changes the loss
    monkeypatch.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: None)
    with pytest.raises(ValueError, match="use_kl_loss=True"):
        _registered(name, old, log_prob, adv, mask, cfg)


# ---------------------------------------------------------------------------------------------------------------
# the logged KL estimate (docs/losses.md#metrics): closed form, for every loss, with a reference ρ ≠ 1
# ---------------------------------------------------------------------------------------------------------------
def _loss_settings():
    """(loss, settings) for every registered loss and every value of its kl_placement option."""
    for name, spec in sorted(L.LOSSES.items()):
        placements = ["additive", "inside_clip"] if "kl_placement" in spec.options else [None]
        for placement in placements:
            yield pytest.param(name, {} if placement is None else {"kl_placement": placement},
                               id=name if placement is None else f"{name}-{placement}")  # fmt: skip


@pytest.mark.parametrize("name, settings", list(_loss_settings()))
def test_logged_kl_is_the_closed_form_estimate_with_a_reference(name, settings, monkeypatch):
    """actor/rpg/kl = mean over valid tokens of ρ·k3(w/ρ) (forward divergences) or w·k3(ρ/w) (reverse ones),
    written here from k3(y) = y − 1 − log y with Python's math, for a frozen reference (ρ a tensor)."""
    import rpg.reference.adapter

    old, log_prob, adv, mask = random_batch(13, spread=0.8)
    ref = old + 0.7 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2), dtype=old.dtype)
    monkeypatch.setattr(rpg.reference.adapter, "current_ref_log_prob", lambda: ref)
    cfg = actor_config(name, kl_coef=0.1, reference="frozen", **settings)
    _, _, metrics = _registered(name, old, log_prob, adv, mask, cfg)

    def k3(y):
        return y - 1.0 - math.log(y)

    forward = L.LOSSES[name].divergence.name in ("fkl", "ufkl")
    estimates = []
    for lp, o, r in zip(log_prob.detach()[mask].tolist(), old[mask].tolist(), ref[mask].tolist()):
        w, rho = math.exp(lp - o), math.exp(r - o)
        estimates.append(rho * k3(w / rho) if forward else w * k3(rho / w))
    assert metrics["actor/rpg/kl"] == pytest.approx(sum(estimates) / len(estimates), rel=1e-10)
