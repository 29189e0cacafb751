"""Which `loss_agg_mode` keeps an RPG KL exact, and the one the KL add-on aggregates its KL term with
(docs/losses.md#kl-aggregation). Standard library only: the launcher's rules read it before verl is imported.

A loss `Σ_{i,t} K_it / D` over a batch of B sampled responses has the expected gradient `c·∇J` of the KL objective
`J` (the enumeration tests' target, tests/test_kl_aggregation_on_cpu.py) only when the denominator `D` is the same
for every batch, i.e. does not depend on the sampled response lengths |y_i| (the end-of-sequence decisions):

* `token-sum` (D = 1), `seq-mean-token-sum` (D = B) and `seq-mean-token-sum-norm` with a fixed
  `actor.loss_scale_factor` (D = B·scale): exact;
* `token-mean` (D = Σ_i |y_i|, the batch's random total of tokens): exact up to a ratio bias of order 1/B
  (negligible at the thousands of responses of a training step; for B = 1 it *is* seq-mean-token-mean); every paper
  recipe uses it;
* `seq-mean-token-mean` (each response weighted by 1/|y_i|): the expected gradient is not β·∇ of any KL, for any B;
  refused for the RPG losses (before launch and inside the loss). Over such a base the KL add-on aggregates its own
  KL term `seq-mean-token-sum-norm` with the fixed `loss_scale_factor` S (D = B·S, exact): against the token-mean's
  D = Σ_i |y_i| ≈ B·E|y| this scales β per token by E|y|/S, the mean length over the constant;
* `seq-mean-token-sum-norm` without `loss_scale_factor`: verl divides by the width of the padded micro-batch, a
  random number again.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "APPROXIMATE_MODES",
    "EXACT_MODES",
    "INEXACT_MODES",
    "addon_kl_agg_mode",
    "aggregation_problem",
    "refuse_inexact_aggregation",
    "rule_kl_aggregation",
]

EXACT_MODES = ("token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm")  # the last with a fixed scale
APPROXIMATE_MODES = ("token-mean",)  # O(1/B) ratio bias
INEXACT_MODES = ("seq-mean-token-mean",)
SCALED_MODE = "seq-mean-token-sum-norm"


WHERE = "actor_rollout_ref.actor.loss_agg_mode"
SCALE_KEY = "actor_rollout_ref.actor.loss_scale_factor"


def addon_kl_agg_mode(base_loss_agg_mode: str) -> str:
    """The aggregation of the KL add-on's KL term for a base aggregated with `base_loss_agg_mode`: the base's own mode,
    except `seq-mean-token-mean` → `seq-mean-token-sum-norm` with the fixed `loss_scale_factor` (a constant
    denominator: exact, and β per token scaled by E|y|/loss_scale_factor against token-mean; the base's term keeps
    seq-mean-token-mean)."""
    return SCALED_MODE if base_loss_agg_mode in INEXACT_MODES else base_loss_agg_mode


def _unscaled(loss_mode: str, loss_agg_mode: str) -> str:
    """Why a `seq-mean-token-sum-norm` KL term without a fixed scale is inexact, and the fix."""
    which = "the KL term" if loss_agg_mode == SCALED_MODE else "the add-on's KL term (seq-mean-token-sum-norm over it)"
    return (
        f"{WHERE}={loss_agg_mode} with loss_mode={loss_mode!r} and no {SCALE_KEY}: {which} is then divided by the "
        f"width of each padded micro-batch, a number that depends on the sampled lengths, so the KL is not exact "
        f"(docs/losses.md#kl-aggregation). Fix: set {SCALE_KEY}=<data.max_response_length> (a constant; it scales β "
        f"per token by the mean response length over it), or {WHERE}=seq-mean-token-sum"
    )


def aggregation_problem(loss_mode: str, addon: bool, loss_agg_mode: str, loss_scale_factor: Any) -> Optional[str]:
    """Why `loss_agg_mode` makes the RPG KL of `loss_mode` inexact, or None: the one message of the launcher's rule
    (`rule_kl_aggregation`) and of the loss's own check (`refuse_inexact_aggregation`).

    The RPG losses carry their KL inside the one aggregated loss, so seq-mean-token-mean is refused for them; the
    add-on aggregates its KL term itself (`addon_kl_agg_mode`) and accepts it with a fixed `loss_scale_factor`.
    `seq-mean-token-sum-norm` needs a fixed `loss_scale_factor` for both."""
    if loss_agg_mode in INEXACT_MODES and not addon:
        return (
            f"{WHERE}={loss_agg_mode} with loss_mode={loss_mode!r}: weighting each response by 1/|y| makes the "
            f"expected gradient of the loss's KL depend on the sampled lengths, so it is not β·∇ of any KL "
            f"(docs/losses.md#kl-aggregation). Fix: {WHERE}=token-mean (the paper's) or seq-mean-token-sum, or put "
            f"the KL beside a verl loss with loss_mode=rpg_kl_<div> and {SCALE_KEY}=<data.max_response_length> (its "
            f"KL term is then aggregated with that constant denominator)"
        )
    if addon_kl_agg_mode(loss_agg_mode) == SCALED_MODE and loss_scale_factor is None:
        return _unscaled(loss_mode, loss_agg_mode)
    return None


def refuse_inexact_aggregation(loss_mode: str, addon: bool, loss_agg_mode: str, batch_info: dict) -> None:
    """Inside an RPG loss (a plain `python -m verl.trainer.main_ppo` run has no launcher): ValueError with
    `aggregation_problem`'s message, for the `loss_scale_factor` verl hands the loss in `global_batch_info`."""
    problem = aggregation_problem(loss_mode, addon, loss_agg_mode, batch_info.get("loss_scale_factor", None))
    if problem is not None:
        raise ValueError(problem)


def rule_kl_aggregation(config, settings) -> Optional[str]:
    """The launcher's rule (`rpg.preflight.rpg_rules.RPG_RULES`) over a composed config and its RPG settings."""
    # deferred: rpg.loss_table imports torch (rpg.divergences), and this module stays standard-library only
    from rpg.loss_table import ADDON

    actor = config.actor_rollout_ref.actor
    mode, scale = str(actor.get("loss_agg_mode", "token-mean")), actor.get("loss_scale_factor", None)
    return aggregation_problem(settings.loss_mode, settings.spec.family == ADDON, mode, scale)
