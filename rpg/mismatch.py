"""The rollout/trainer mismatch, judged from verl 0.9.1's own metrics: one summary line, a verdict and the settings to
consider (docs/gpu.md#mismatch).

vLLM samples with its kernels and bf16 weights; the trainer recomputes the same tokens' log-probs with FSDP's. Where
the two disagree, π_old is not the policy that sampled: the failure that silently spoils bf16 RL runs. verl 0.9.1
measures it every step, in the trainer (`trainer/ppo/v1/trainer_base.py`), when `rollout.calculate_log_probs` is on
(verl's default) and `algorithm.rollout_correction.bypass_mode` is off:

* `training/rollout_probs_diff_{max,mean,std}` (`verl/utils/debug/metrics.py`): |π_trainer(y) − π_rollout(y)| over
  the response tokens: differences of *probabilities*, not log-probabilities;
* `rollout_corr/{kl,k3_kl,chi2_token,chi2_seq}` (`trainer/ppo/rollout_corr_helper.py` `compute_offpolicy_metrics`,
  logged by the rollout-correction group that verl's config always has, `rollout_is: null` = metrics only):
  KL(π_rollout‖π_trainer) directly and by k3, and the χ² of the token and sequence importance weights.

In bypass mode π_old *is* vLLM's, so none of those is logged; the loss logs the importance-weight statistics of
π_θ/π_rollout instead (`core_algos.compute_policy_loss_bypass_mode`: `rollout_is_{mean,std,max,min}`,
`rollout_is_eff_sample_size`, under the actor's metric prefix), and their spread is reported.

The share of tokens with |Δ log p| > `LOGP_THRESHOLD` (log 2: a token whose probability ratio leaves [1/2, 2], verl's
default TIS threshold) is the one figure verl does not log. `token_share_over` computes it from the two log-prob
tensors, and `with_share`, this module's piece (`PIECES`) of verl's `calculate_debug_metrics` (the one place in the
trainer where both exist), adds `SHARE_KEY`: the table of patch points (`rpg.patches`) hooks it for
`RPG_INSTALL=mismatch_share`, which every smoke run (`SMOKE=1`) selects (`rpg.install.for_smoke`). The report shows
the share when a run logged it, else says it was not measured.

The thresholds are heuristics (rules of thumb, not measured on this project's recipes): a run is flagged when
k3 KL > 1e-3 per token, χ² per token > 0.05, a token's probability differs by more than 0.5, more than 0.1 % of
tokens leave the 2× band, or (bypass) the importance weights' standard deviation exceeds 0.1. On CPU in fp32 the gap
is about 3e-7 and the verdict is OK; in bf16 on a GPU it is orders larger and model-dependent.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional

LOGP_THRESHOLD = math.log(2.0)
SHARE_KEY = "training/rollout_logp_diff_share"  # share of response tokens with |Δ log p| > LOGP_THRESHOLD
PROBS_DIFF = "training/rollout_probs_diff_"
CORR = "rollout_corr/"
# heuristic limits of the verdict: (metric, limit, what it means)
LIMITS = (
    (f"{CORR}k3_kl", 1e-3, "k3 KL(rollout‖trainer) per token"),
    (f"{CORR}chi2_token", 0.05, "χ² of the token importance weights"),
    (f"{PROBS_DIFF}max", 0.5, "largest |Δ probability| of a token"),
    (SHARE_KEY, 1e-3, f"share of tokens with |Δ log p| > log 2"),
)
IS_STD_LIMIT = 0.1  # bypass mode: standard deviation of the importance weights π_θ/π_rollout
ADVICE = (
    "settings to consider (verl's rollout correction, docs/gpu.md#mismatch): token-level truncated importance weights "
    "algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0; or mask the "
    "tokens outside a ratio band, algorithm.rollout_correction.rollout_rs=token_k1 "
    "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0; and look for its cause (vLLM and trainer dtypes, "
    "a stale weight sync, actor_rollout_ref.rollout.temperature applied on one side only)"
)


def token_share_over(trainer_logp, rollout_logp, mask, threshold: float = LOGP_THRESHOLD) -> float:
    """Share of the masked tokens whose |trainer − rollout| log-prob difference exceeds `threshold` (0 without
    tokens). Torch tensors of one shape; padding never counts."""
    valid = mask.bool()
    n = int(valid.sum())
    if n == 0:
        return 0.0
    over = ((trainer_logp - rollout_logp).abs() > threshold) & valid
    return float(over.sum()) / n


def with_share(call, data: Any) -> dict:
    """The piece of verl's `calculate_debug_metrics(data)` (`rpg.patches`): its metrics plus `SHARE_KEY`, from the
    same tensors it reads (`old_log_probs`, `rollout_log_probs`, the response mask)."""
    metrics = call(data)
    batch = data.batch
    logp, rollout = batch["old_log_probs"], batch["rollout_log_probs"]
    mask = batch["response_mask"] if "response_mask" in batch.keys() else batch["attention_mask"]
    metrics[SHARE_KEY] = token_share_over(logp, rollout, mask[:, -logp.shape[-1]:])
    return metrics


#: the pieces of `rpg.patches` for ``RPG_INSTALL=mismatch_share`` (attribute -> piece)
PIECES = {"calculate_debug_metrics": with_share}


def _steps(rows: Mapping[int, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [rows[s] for s in sorted(rows) if s > 0]


def _values(steps: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    out = []
    for data in steps:
        value = data.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.append(float(value))
    return out


def _bypass_is_key(steps: list[Mapping[str, Any]], stat: str) -> Optional[str]:
    return next((k for data in steps for k in data if k.endswith(f"rollout_is_{stat}")), None)


def summary(rows: Mapping[int, Mapping[str, Any]]) -> tuple[str, list[str]]:
    """(the summary line's figures, the heuristic limits exceeded) over the training steps of a metrics log
    (step -> metrics, as `rpg.smoke.read_log` returns)."""
    steps = _steps(rows)
    parts, exceeded = [], []
    mean, worst = _values(steps, f"{PROBS_DIFF}mean"), _values(steps, f"{PROBS_DIFF}max")
    if mean:
        parts.append(f"|Δ probability| mean {sum(mean) / len(mean):.2e}, max {max(worst or mean):.2e}")
    for key, label in ((f"{CORR}k3_kl", "k3 KL"), (f"{CORR}chi2_token", "χ² token")):
        if got := _values(steps, key):
            parts.append(f"{label} {max(got):.2e}")
    share = _values(steps, SHARE_KEY)
    measured = f"{max(share):.3%}" if share else "not measured (not logged by this run)"
    parts.append(f"tokens with |Δ log p| > log 2: {measured}")
    std_key = _bypass_is_key(steps, "std")
    if std_key and not mean:  # bypass mode: π_old is vLLM's, the loss logs the importance weights
        std = _values(steps, std_key)
        lo, hi = _values(steps, std_key[: -len("std")] + "min"), _values(steps, std_key[: -len("std")] + "max")
        spread = f", range {min(lo):.3g} .. {max(hi):.3g}" if lo and hi else ""
        parts.append(f"bypass mode: importance weights π_θ/π_rollout std {max(std):.2e}{spread}")
        if max(std) > IS_STD_LIMIT:
            exceeded.append(f"importance-weight std {max(std):.2e} > {IS_STD_LIMIT:g}")
    for key, limit, what in LIMITS:
        got = _values(steps, key)
        if got and max(got) > limit:
            exceeded.append(f"{what} {max(got):.2e} > {limit:g}")
    return "; ".join(parts), exceeded


def report_lines(rows: Mapping[int, Mapping[str, Any]]) -> str:
    """The smoke report's mismatch line, its verdict and (when large) the settings to consider; "" when the run logged
    none of verl's mismatch metrics (rollout.calculate_log_probs off)."""
    figures, exceeded = summary(rows)
    if not any(k.startswith((PROBS_DIFF, CORR)) or k.endswith("rollout_is_std") for d in _steps(rows) for k in d):
        return ("[rpg smoke] rollout/trainer mismatch: not measured (set actor_rollout_ref.rollout.calculate_log_probs="
                "True, verl's default, to log it)\n")
    verdict = "OK" if not exceeded else "LARGE: " + "; ".join(exceeded)
    lines = [
        f"[rpg smoke] rollout/trainer mismatch: {figures}",
        f"  verdict: {verdict} (heuristic thresholds, rpg/mismatch.py)",
    ]
    if exceeded:
        lines.append("  " + ADVICE)
    return "\n".join(lines) + "\n"
