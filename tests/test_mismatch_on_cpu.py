"""The rollout/trainer mismatch report (rpg/mismatch.py): verl 0.9.1's metrics summarised in one line with a
verdict, the settings to consider when it is large, the bypass-mode importance-weight spread, and the share of
tokens with |Δ log p| > log 2 that verl does not log (computed from the two log-prob tensors). The vLLM CPU run's
line (verdict OK): tests/vllm_cpu/test_vllm_e2e_on_cpu.py."""

import math

import pytest
import torch

from rpg.mismatch import LOGP_THRESHOLD, SHARE_KEY, report_lines, token_share_over, with_share

CPU_FP32 = {
    "training/rollout_probs_diff_mean": 3e-7, "training/rollout_probs_diff_max": 2e-6,
    "training/rollout_probs_diff_std": 1e-7, "rollout_corr/kl": 1e-9, "rollout_corr/k3_kl": 1e-12,
    "rollout_corr/chi2_token": 2e-9, "rollout_corr/chi2_seq": 1e-8,
}


def test_a_small_gap_is_ok_and_names_what_was_not_measured():
    text = report_lines({0: {"val-core/acc": 0.5}, 1: CPU_FP32, 2: CPU_FP32})
    assert text.startswith("[rpg smoke] rollout/trainer mismatch: |Δ probability| mean 3.00e-07, max 2.00e-06; "
                           "k3 KL 1.00e-12; χ² token 2.00e-09; tokens with |Δ log p| > log 2: not measured"), text
    assert "verdict: OK (heuristic thresholds" in text and "rollout_is=token" not in text


def test_large_metrics_give_the_warning_and_the_settings_to_consider():
    large = {**CPU_FP32, "training/rollout_probs_diff_mean": 0.02, "training/rollout_probs_diff_max": 0.9}
    large.update({"rollout_corr/k3_kl": 4e-3, SHARE_KEY: 0.012})
    text = report_lines({1: CPU_FP32, 2: large})
    assert "tokens with |Δ log p| > log 2: 1.200%" in text and "max 9.00e-01" in text, text
    verdict = next(line for line in text.splitlines() if "verdict" in line)
    parts = ("LARGE", "k3 KL(rollout‖trainer) per token 4.00e-03 > 0.001", "largest |Δ probability| of a token",
             "share of tokens with |Δ log p| > log 2 1.20e-02 > 0.001")
    for part in parts:
        assert part in verdict, (part, verdict)
    assert "algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0" in text
    assert "algorithm.rollout_correction.rollout_rs=token_k1" in text


def test_bypass_mode_reports_the_importance_weight_spread():
    bypass = {"actor/rollout_is_mean": 1.0, "actor/rollout_is_std": 0.3}
    bypass.update({"actor/rollout_is_min": 0.2, "actor/rollout_is_max": 6.0})
    text = report_lines({1: bypass})
    assert "bypass mode: importance weights π_θ/π_rollout std 3.00e-01, range 0.2 .. 6" in text, text
    assert "LARGE: importance-weight std 3.00e-01 > 0.1" in text
    assert "verdict: OK" in report_lines({1: {**bypass, "actor/rollout_is_std": 0.01}})
    assert "not measured (set actor_rollout_ref.rollout.calculate_log_probs=True" in report_lines({1: {"x": 1.0}})


def test_the_share_over_the_threshold_counts_response_tokens_only():
    trainer = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -9.0, 0.0]])
    rollout = torch.tensor([[-1.0, -1.0 - 0.7, -1.0 + 0.6, -1.0], [-2.0, -2.0, -2.0, -50.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])  # the last token is padding: its gap never counts
    assert LOGP_THRESHOLD == pytest.approx(math.log(2))
    assert token_share_over(trainer, rollout, mask) == pytest.approx(2 / 7)  # 0.7 > log 2 and 7.0; not 0.6
    assert token_share_over(trainer, rollout, torch.zeros_like(mask)) == 0.0


def test_the_share_is_added_to_verls_debug_metrics():
    class Data:  # verl's DataProto as calculate_debug_metrics reads it
        batch = {"old_log_probs": torch.tensor([[-1.0, -3.0]]), "rollout_log_probs": torch.tensor([[-1.0, -1.0]])}
        batch["response_mask"] = torch.tensor([[1, 1]])

    got = with_share(lambda data: {"training/rollout_probs_diff_mean": 0.1}, Data())
    assert got == {"training/rollout_probs_diff_mean": 0.1, SHARE_KEY: 0.5}


def test_install_wraps_verls_trainer_call_once_and_is_guarded(monkeypatch):
    import verl.trainer.ppo.v1.trainer_base as trainer

    from rpg import install, patches

    original = trainer.calculate_debug_metrics
    assert not install.installed(install.MISMATCH_SHARE)
    try:
        install.install([install.MISMATCH_SHARE])
        install.install([install.MISMATCH_SHARE])  # idempotent: wrapped once
        wrapper = trainer.calculate_debug_metrics
        assert install.installed(install.MISMATCH_SHARE) and wrapper.__wrapped__ is original
        assert patches.patch_of(wrapper).pieces == {install.MISMATCH_SHARE: with_share}
    finally:
        install.uninstall([install.MISMATCH_SHARE])
    assert trainer.calculate_debug_metrics is original
    monkeypatch.setattr(trainer, "calculate_debug_metrics", lambda batch, extra: {})
    with pytest.raises(RuntimeError, match="calculate_debug_metrics"):
        install.check([install.MISMATCH_SHARE])
