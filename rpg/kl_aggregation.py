"""Which `loss_agg_mode` keeps an RPG KL exact, and the one the KL add-on aggregates its KL term with
(docs/losses.md#kl-aggregation). Standard library only: the launcher's rules read it before verl is imported.

A loss `Σ_{i,t} K_it / D` over a batch of B sampled responses has the expected gradient `c·∇J` of the KL objective
`J` (the enumeration tests' target, tests/test_kl_aggregation_on_cpu.py) only when the denominator `D` is the same
for every batch, i.e. does not depend on the sampled response lengths |y_i| (the end-of-sequence decisions):

* `token-sum` (D = 1), `seq-mean-token-sum` (D = B) and `seq-mean-token-sum-norm` with a fixed
  `actor.loss_scale_factor` (D = B·scale): exact;
* `token-mean` (D = Σ_i |y_i|, the batch's random total of tokens): exact up to a ratio bias of order 1/B (0 at the
  thousands of responses of a training step, and for B = 1 it *is* seq-mean-token-mean); every paper recipe uses it;
* `seq-mean-token-mean` (each response weighted by 1/|y_i|): the expected gradient is not β·∇ of any KL, for any B;
* `seq-mean-token-sum-norm` without `loss_scale_factor`: verl divides by the width of the padded micro-batch, a
  random number again.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "APPROXIMATE_MODES", "EXACT_MODES", "INEXACT_MODES", "addon_kl_agg_mode", "aggregation_problem",
    "rule_kl_aggregation",
]  # fmt: skip

EXACT_MODES = ("token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm")  # the last with a fixed scale
APPROXIMATE_MODES = ("token-mean",)  # O(1/B) ratio bias
INEXACT_MODES = ("seq-mean-token-mean",)
SCALED_MODE = "seq-mean-token-sum-norm"


def addon_kl_agg_mode(base_loss_agg_mode: str) -> str:
    """The aggregation of the KL add-on's KL term for a base aggregated with `base_loss_agg_mode`: the base's own mode,
    except `seq-mean-token-mean` → `token-mean` (the same per-token scale of β, without the 1/|y| weights that make
    the KL inexact; the base's term keeps seq-mean-token-mean)."""
    return "token-mean" if base_loss_agg_mode in INEXACT_MODES else base_loss_agg_mode


def aggregation_problem(loss_mode: str, addon: bool, loss_agg_mode: str, loss_scale_factor: Any) -> Optional[str]:
    """Why `loss_agg_mode` makes the RPG KL of `loss_mode` inexact (a refusal before launch), or None.

    The RPG losses carry their KL inside the one aggregated loss, so seq-mean-token-mean is refused for them; the
    add-on aggregates its KL term itself (`addon_kl_agg_mode`) and accepts it. `seq-mean-token-sum-norm` needs a fixed
    `loss_scale_factor` for both."""
    where = "actor_rollout_ref.actor.loss_agg_mode"
    if loss_agg_mode in INEXACT_MODES and not addon:
        return (
            f"{where}={loss_agg_mode} with loss_mode={loss_mode!r}: weighting each response by 1/|y| makes the "
            f"expected gradient of the loss's KL depend on the sampled lengths, so it is not β·∇ of any KL "
            f"(docs/losses.md#kl-aggregation). Fix: {where}=token-mean (the paper's) or seq-mean-token-sum, or put "
            f"the KL beside a verl loss with loss_mode=rpg_kl_<div> (its KL term is aggregated token-mean)"
        )
    if loss_agg_mode == SCALED_MODE and loss_scale_factor is None:
        return (
            f"{where}={loss_agg_mode} with loss_mode={loss_mode!r} and no actor_rollout_ref.actor.loss_scale_factor: "
            f"verl then divides by the width of each padded micro-batch, a number that depends on the sampled "
            f"lengths, so the KL is not exact (docs/losses.md#kl-aggregation). Fix: set "
            f"actor_rollout_ref.actor.loss_scale_factor=<data.max_response_length> (a constant), or "
            f"{where}=seq-mean-token-sum"
        )
    return None


def rule_kl_aggregation(config, settings) -> Optional[str]:
    """The launcher's rule (`rpg.preflight.rpg_rules.RPG_RULES`) over a composed config and its RPG settings."""
    from rpg.loss_table import ADDON

    actor = config.actor_rollout_ref.actor
    mode, scale = str(actor.get("loss_agg_mode", "token-mean")), actor.get("loss_scale_factor", None)
    return aggregation_problem(settings.loss_mode, settings.spec.family == ADDON, mode, scale)
