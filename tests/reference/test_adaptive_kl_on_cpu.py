"""The adaptive β (rpg/reference/adaptive_kl.py: Ziegler et al. 2019's proportional controller, as verl's
AdaptiveKLController) and the settings of the EMA reference and the controller (rpg/config.py): the recurrence over a
sequence of KL values, agreement with verl's controller, exact restore, the β the losses read, bad settings named.
<1 s."""

import json
import math

import numpy as np
import pytest

from rpg.loss_config import RPGPolicyLossConfig
from rpg.reference import adaptive_kl, step
from rpg.reference.adaptive_kl import AdaptiveKLCoef

KLS = [0.0, 0.001, 0.02, 0.05, 0.2, None, 0.011, float("nan"), 0.01, 3.0, 0.0099]


def recurrence(beta0, target, horizon, kls):
    """β_1 = β0; β_{t+1} = β_t·(1 + clip(KL_t/target − 1, −0.2, 0.2)/H); a step without a finite KL keeps β."""
    betas = [beta0]
    for kl in kls:
        b = betas[-1]
        if kl is not None and math.isfinite(kl):
            b = b * (1 + min(max(kl / target - 1, -0.2), 0.2) / horizon)
        betas.append(b)
    return betas


def test_the_controller_follows_its_recurrence():
    ctl = AdaptiveKLCoef(kl_coef=1e-3, target=0.01, horizon=4.0)
    betas = [ctl.value] + [ctl.update(kl) for kl in KLS]
    assert betas == recurrence(1e-3, 0.01, 4.0, KLS)  # bit for bit: the same float operations
    assert betas[1] == pytest.approx(1e-3 * 0.95) and betas[5] == pytest.approx(betas[4] * 1.05)  # clipped at ∓0.2
    assert betas[6] == betas[5] and betas[8] == betas[7]  # None / NaN: no change
    assert ctl.updates == len(KLS) and ctl.last_kl == 0.0099


def test_the_controller_matches_verls_adaptive_kl_controller():
    from verl.trainer.ppo.core_algos import AdaptiveKLController

    batch = 512  # verl's horizon counts sequences (n_steps = batch size): H_verl = H·B
    ours, theirs = AdaptiveKLCoef(1e-3, 0.01, 4.0), AdaptiveKLController(1e-3, 0.01, 4.0 * batch)
    for kl in (k for k in KLS if k is not None and math.isfinite(k)):
        ours.update(kl)
        theirs.update(kl, n_steps=batch)
        assert ours.value == pytest.approx(float(theirs.value), rel=1e-14)


def test_the_controller_restores_exactly_through_json():
    full = AdaptiveKLCoef(2e-4, 0.003, 1.7)
    half = AdaptiveKLCoef(2e-4, 0.003, 1.7)
    for kl in KLS[:5]:
        full.update(kl)
        half.update(kl)
    saved = json.loads(json.dumps(half.state_dict()))  # the checkpoint's rpg_kl_control.json
    resumed = AdaptiveKLCoef(2e-4, 0.003, 1.7)
    resumed.load_state_dict(saved)
    assert resumed.value == half.value and resumed.updates == 5
    for kl in KLS[5:]:
        assert resumed.update(kl) == full.update(kl)  # identical β step for step
    assert resumed.state_dict() == full.state_dict()


@pytest.mark.parametrize("state, match", [
    ({"kl_coef": 0.0, "updates": 1, "last_kl": None}, "kl_coef"),
    ({"kl_coef": float("inf"), "updates": 1, "last_kl": None}, "kl_coef"),
    ({"kl_coef": 1e-3, "updates": -1, "last_kl": None}, "updates"),
    ({"kl_coef": 1e-3, "updates": 1}, "missing"),
])  # fmt: skip
def test_a_corrupt_state_is_refused(state, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveKLCoef(1e-3, 0.01, 4.0).load_state_dict(state)


def test_the_losses_read_the_steps_beta_and_feed_its_loss_kl():
    """One `TrainingStep` (rpg/reference/step.py) carries β and the loss's KL sum: the losses read β from it with
    kl_control='adaptive' (kl_coef with 'fixed'), add their `actor/rpg/kl` statistic to it, and without an open step
    an adaptive β is refused."""
    fixed = RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", kl_coef=0.05)
    adaptive = RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", kl_coef=0.05, kl_control="adaptive",
                                   kl_target=0.01)  # fmt: skip
    assert step.kl_coef(fixed) == 0.05
    with pytest.raises(RuntimeError, match="no adaptive-β controller is active"):
        step.kl_coef(adaptive)
    ctl = AdaptiveKLCoef(0.05, 0.01, 2.0)
    ctl.update(1.0)
    state = adaptive_kl.AdaptiveBeta(ctl)
    with step.running(step.TrainingStep()) as current:
        state.start_step(current)
        assert step.kl_coef(adaptive) == 0.05 * 1.1
        assert step.kl_coef(fixed) == 0.05
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
        from verl.workers.config import ActorConfig

        import torch

        g = torch.Generator().manual_seed(0)
        old = -torch.rand(3, 5, generator=g) - 0.1
        log_prob, adv = old + 0.2 * torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
        mask = torch.ones(3, 5)
        cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio_c=3.0,
                          policy_loss=adaptive)  # fmt: skip
        loss_fn = POLICY_LOSS_REGISTRY["rpg_reinforce_urkl"]
        _, m = loss_fn(old, log_prob, adv, mask, "token-mean", cfg, None)
        ref_kl, ref_tokens, kl_sum, tokens = current.sums()
        assert (ref_kl, ref_tokens) == (0.0, 0.0)  # no reference KL asked for: the adaptive β reads the loss's KL
        assert tokens == 15 and kl_sum / tokens == pytest.approx(m["actor/rpg/kl"], rel=1e-12)
        # β enters the loss: the KL part of A' scales with the step's β
        current.beta = 0.1
        _, m2 = loss_fn(old, log_prob, adv, mask, "token-mean", cfg, None)
        assert m2["actor/rpg/kl_adv_abs"] == pytest.approx(m["actor/rpg/kl_adv_abs"] * 0.1 / (0.05 * 1.1), rel=1e-6)
    assert current.sums()[3] == 2 * tokens  # the two calls inside the step
    with pytest.raises(RuntimeError, match="no adaptive-β controller is active"):  # outside the step: no β
        loss_fn(old, log_prob, adv, mask, "token-mean", cfg, None)
    assert current.sums()[3] == 2 * tokens
    metrics = state.end_step(None, kl_sum / tokens)
    assert metrics["kl_coef"] == 0.05 * 1.1 and set(metrics) <= set(state.row.metrics)


@pytest.mark.parametrize("kwargs, match", [
    ({"reference": "ema", "ref_ema_decay": 1.0}, r"ref_ema_decay .*must be in \[0, 1\), got 1.0.*reference=frozen"),
    ({"reference": "ema", "ref_ema_decay": -0.1}, r"ref_ema_decay .*\[0, 1\)"),
    ({"reference": "ema", "ref_ema_period": 0}, r"ref_ema_period .*integer ≥ 1, got 0"),
    ({"reference": "ema", "ref_ema_period": 1.5}, r"ref_ema_period .*integer ≥ 1"),
    ({"kl_control": "pid"}, r"kl_control='pid' is not valid; choose one of \['fixed', 'adaptive'\]"),
    ({"kl_control": "adaptive"}, r"kl_target .*> 0 with kl_control='adaptive', got 0.0"),
    ({"kl_control": "adaptive", "kl_target": float("inf")}, r"kl_target"),
    ({"kl_control": "adaptive", "kl_target": 0.01, "kl_horizon": 0.2}, r"kl_horizon .*> 0.2, got 0.2"),
    ({"kl_control": "adaptive", "kl_target": 0.01, "kl_coef": 0.0}, r"kl_coef must be > 0"),
    ({"ref_ema_decay": 0.5}, r"ref_ema_decay=0.5 has no effect .*only with reference='ema'"),
    ({"reference": "periodic", "ref_refresh_steps": 2, "ref_ema_period": 3}, r"ref_ema_period=3 has no effect"),
    ({"reference": "ema", "ref_refresh_steps": 2}, r"ref_refresh_steps=2 has no effect"),
    ({"kl_target": 0.1}, r"kl_target=0.1 has no effect .*only with kl_control='adaptive'"),
])  # fmt: skip
def test_bad_ema_and_controller_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RPGPolicyLossConfig(loss_mode="rpg_reinforce_urkl", **kwargs)


def test_kl_control_is_refused_for_verls_own_losses():
    with pytest.raises(ValueError, match="kl_control='adaptive' has no effect on verl's loss_mode='vanilla'"):
        RPGPolicyLossConfig(loss_mode="vanilla", kl_control="adaptive", kl_target=0.01)


def test_good_settings_build():
    RPGPolicyLossConfig(loss_mode="rpg_urkl", reference="ema", ref_ema_decay=0.0, ref_ema_period=1)
    RPGPolicyLossConfig(loss_mode="rpg_fkl", kl_control="adaptive", kl_target=0.02, kl_horizon=10.0, reference="ema")
    assert np.isclose(RPGPolicyLossConfig(loss_mode="rpg_urkl").kl_horizon, 10.0)


# ---------------------------------------------------------------------------------------------------------------------
# What the controller tracks: the KL the loss regularises (docs/losses.md#adaptive-beta), handed over once per call
# ---------------------------------------------------------------------------------------------------------------------
def _topk_step(loss_mode: str, beta0: float = 0.3):
    """One training step with the adaptive β and kl_estimator=topk, through the registered loss and the step state
    (as the worker hooks run it): (the step's sums, the loss's metrics, the controller's metrics)."""
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl_batch import actor_config

    import rpg.verl_plugin  # noqa: F401  (registers the RPG losses)
    from rpg import topk_hook
    from rpg.reference import micro_batch

    g = torch.Generator().manual_seed(5)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    old = torch.randn(2, 4, generator=g).clamp(max=-0.1)
    log_prob = (old + 0.3 * torch.randn(2, 4, generator=g)).requires_grad_()
    adv = torch.tensor([[1.0], [-0.5]]).expand(2, 4) * mask
    kl = 2.0 * torch.rand(2, 4, generator=g)  # the engine hook's analytic part, far from the sampled estimate
    in_support = torch.tensor([[True, False, True, False], [False, True, True, True]])
    config = actor_config(loss_mode, kl_coef=beta0, kl_estimator="topk", kl_control="adaptive", kl_target=0.01)
    state = adaptive_kl.AdaptiveBeta(AdaptiveKLCoef(beta0, 0.01, 10.0))
    with micro_batch.opened(micro_batch.MicroBatch(topk=topk_hook.TopKTerms(kl, in_support))):
        with step.running(step.TrainingStep()) as current:
            state.start_step(current)
            _, metrics = get_policy_loss_fn(loss_mode)(old, log_prob, adv, mask, "token-mean", config, None)
    _, _, kl_sum, tokens = current.sums()
    return (kl_sum, tokens), metrics, state.end_step(None, kl_sum / tokens)


def _feeds_the_sampled_kl(monkeypatch):
    """The mutant: the controller gets the sampled estimate (actor/rpg/kl) from where the metrics compute it, as
    `_metrics` once did, instead of the KL the loss regularises."""
    import rpg.kl_addon
    import rpg.losses

    hand = rpg.losses.hand_kl_to_step

    def feeding(estimate):
        def sampled(term, div):
            kl = estimate(term, div)
            hand(kl, term.mask)
            return kl

        return sampled

    monkeypatch.setattr(rpg.losses, "hand_kl_to_step", lambda kl, mask: None)
    monkeypatch.setattr(rpg.losses, "sampled_estimate", feeding(rpg.losses.sampled_estimate))
    monkeypatch.setattr(rpg.kl_addon, "sampled_estimate", feeding(rpg.kl_addon.sampled_estimate))


def _follows_the_topk_kl(sums, metrics, controller) -> bool:
    (kl_sum, tokens), topk_kl = sums, metrics["actor/rpg/topk_kl"]
    next_beta = recurrence(0.3, 0.01, 10.0, [topk_kl])[-1]
    return (
        tokens == 5
        and kl_sum / tokens == pytest.approx(topk_kl, rel=1e-12)
        and controller["kl_ctrl_kl"] == pytest.approx(topk_kl, rel=1e-12)
        and controller["kl_coef_next"] == pytest.approx(next_beta, rel=1e-12)
    )


@pytest.mark.parametrize("loss_mode", ["rpg_urkl", "rpg_reinforce_hardclip_ufkl", "rpg_kl_rkl"])
def test_the_adaptive_beta_under_topk_follows_the_topk_kl(loss_mode, monkeypatch):
    """kl_estimator=topk: the step's loss-KL sums are the top-k KL's (actor/rpg/topk_kl, which the loss regularises),
    not the sampled estimate's (actor/rpg/kl, still logged); β's next value follows it. The mutant that feeds the
    sampled estimate fails the same check."""
    sums, metrics, controller = _topk_step(loss_mode)
    assert abs(metrics["actor/rpg/kl"] - metrics["actor/rpg/topk_kl"]) > 0.1  # the two KLs differ: the check can fail
    assert _follows_the_topk_kl(sums, metrics, controller)
    with monkeypatch.context() as m:
        _feeds_the_sampled_kl(m)
        sums, metrics, controller = _topk_step(loss_mode)
        assert not _follows_the_topk_kl(sums, metrics, controller)
        assert sums[0] / sums[1] == pytest.approx(metrics["actor/rpg/kl"], rel=1e-6)  # the mutant's: the sampled one


def test_the_sampled_estimator_feeds_its_estimate_once_per_call():
    """kl_estimator=sampled: the KL the loss regularises is its sampled estimate (actor/rpg/kl), handed over once per
    loss call by policy_loss_fn (the token count is the call's, once)."""
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl_batch import actor_config

    import rpg.verl_plugin  # noqa: F401

    g = torch.Generator().manual_seed(2)
    old = -torch.rand(2, 6, generator=g) - 0.1
    log_prob, adv = old + 0.2 * torch.randn(2, 6, generator=g), torch.randn(2, 6, generator=g)
    mask = torch.ones(2, 6, dtype=torch.bool)
    for loss_mode in ("rpg_reinforce_urkl", "rpg_kl_fkl"):
        config = actor_config(loss_mode, kl_coef=0.05, kl_control="adaptive", kl_target=0.01)
        with step.running(step.TrainingStep()) as current:
            adaptive_kl.AdaptiveBeta(AdaptiveKLCoef(0.05, 0.01, 10.0)).start_step(current)
            _, metrics = get_policy_loss_fn(loss_mode)(old, log_prob, adv, mask, "token-mean", config, None)
        _, _, kl_sum, tokens = current.sums()
        assert tokens == 12 and kl_sum / tokens == pytest.approx(metrics["actor/rpg/kl"], rel=1e-6)
