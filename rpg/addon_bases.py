"""The bases of the KL add-on (`rpg_kl_<div>`, `policy_loss.base_loss_mode`): what each one's own source publishes
for its clip and aggregation, and the launcher's early warning when a run's clip is of the other kind
(docs/losses.md#addon-bases). The one table of the bases: the loss table's `rpg.loss_table.ADDON_BASES` (the
add-on's choices of `base_loss_mode`) is its names. Standard library only.

A base's clip reads verl's `clip_ratio_low`/`clip_ratio_high` with its own meaning: a token ratio's range (PPO), a
sequence ratio's range (GSPO: values of order 1e-4), a log-ratio bound (GMPO), a divergence threshold (DPPO). The
recipes' shared default is DAPO's token-level (0.2, 0.28): under GSPO's sequence ratio it clips almost nothing, and
GSPO's (3e-4, 4e-4) under a token ratio clips almost every token. The warning names the base's published values; it
does not change the run (a clip is a choice, and the add-on's KL does not depend on it).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

__all__ = ["BASES", "BaseDefaults", "clip_kind", "clip_warning", "config_warning", "markdown_table"]

TOKEN, SEQUENCE, LOG, DIVERGENCE, NONE = "token ratio", "sequence ratio", "token log-ratio", "divergence", "none"
#: Below this ε a clip range is a sequence ratio's (GSPO: 3e-4, 4e-4); token-level ranges are 0.1 and above.
SEQUENCE_SCALE = 0.01


class BaseDefaults(NamedTuple):
    name: str
    clips: str  # what clip_ratio_low/high bound: TOKEN, SEQUENCE, LOG, DIVERGENCE or NONE
    clip: Optional[tuple[float, float]]  # the published (ε1, ε2); None: no value published or none to publish
    loss_agg_mode: str  # the aggregation of the base's own term in its source (verl's default for it)
    source: str


BASES: dict[str, BaseDefaults] = {b.name: b for b in (
    BaseDefaults("vanilla", TOKEN, (0.2, 0.2), "token-mean",
                 "PPO (Schulman et al. 2017, arXiv 1707.06347, §6.1: ε = 0.2); the mean over timesteps"),
    BaseDefaults("gspo", SEQUENCE, (3e-4, 4e-4), "seq-mean-token-mean",
                 "GSPO (Zheng et al. 2025, arXiv 2507.18071, §5.1: left 3e-4, right 4e-4); one term per response"),
    BaseDefaults("cispo", TOKEN, None, "token-mean",
                 "CISPO (MiniMax-M1, arXiv 2506.13585, §3.1): clips the detached IS weight, ε_high tuned and not "
                 "published, no lower bound; normalised by the batch's tokens"),
    BaseDefaults("gpg", NONE, None, "token-mean", "GPG (Chu et al. 2025, arXiv 2504.02546): no ratio, no clip"),
    BaseDefaults("sapo", NONE, None, "seq-mean-token-mean",
                 "SAPO (arXiv 2511.20347): a soft gate (tau_pos, tau_neg) instead of a clip; verl's default "
                 "aggregation"),
    BaseDefaults("geo_mean", LOG, (0.4, 0.4), "seq-mean-token-mean",
                 "GMPO (Zhao et al. 2025, arXiv 2507.20673): log w clipped to [−0.4, 0.4]; a geometric mean per "
                 "response (verl aggregates it itself)"),
    BaseDefaults("dppo_tv", DIVERGENCE, None, "token-mean",
                 "DPPO (arXiv 2602.04879): a threshold on π − π_old, not a ratio range; no value checked here"),
    BaseDefaults("dppo_kl", DIVERGENCE, None, "token-mean",
                 "DPPO (arXiv 2602.04879): a threshold on the per-token KL, not a ratio range; no value checked here"),
    BaseDefaults("clip_cov", TOKEN, None, "token-mean",
                 "Clip-Cov (Cui et al. 2025, arXiv 2505.22617): PPO's token clip plus covariance-selected tokens; "
                 "clip_cov_* are verl's defaults, no ratio range checked here"),
    BaseDefaults("kl_cov", TOKEN, None, "token-mean",
                 "KL-Cov (Cui et al. 2025, arXiv 2505.22617): a KL penalty on covariance-selected tokens; no ratio "
                 "range checked here"),
    BaseDefaults("dro", NONE, None, "token-mean",
                 "verl's DRO: a quadratic log-ratio penalty (dro_beta) instead of a clip"),
)}


def clip_kind(low: float, high: float) -> str:
    """SEQUENCE for a range of a sequence ratio's scale (max ε < 0.01), else TOKEN."""
    return SEQUENCE if max(abs(low), abs(high)) < SEQUENCE_SCALE else TOKEN


def clip_warning(base: str, low: float, high: float) -> Optional[str]:
    """The early warning for the add-on over `base` with clip (ε1, ε2) = (low, high), or None: a base whose published
    range is a token ratio's (or a log-ratio's) run with a sequence-scale range, or the reverse."""
    known = BASES.get(base)
    if known is None or known.clip is None or known.clips not in (TOKEN, SEQUENCE, LOG):
        return None
    expected = SEQUENCE if known.clips == SEQUENCE else TOKEN
    got = clip_kind(low, high)
    if got == expected:
        return None
    return (f"[rpg] warning: base_loss_mode={base} bounds a {known.clips} and publishes (ε1, ε2) = {known.clip} with "
            f"loss_agg_mode={known.loss_agg_mode} ({known.source.split(',')[0]}), but this run's clip "
            f"(clip_ratio_low={low:g}, clip_ratio_high={high:g}) is of a {got}'s scale. For the base's own, pass "
            f"actor_rollout_ref.actor.clip_ratio_low={known.clip[0]:g} actor_rollout_ref.actor.clip_ratio_high="
            f"{known.clip[1]:g} actor_rollout_ref.actor.loss_agg_mode={known.loss_agg_mode} "
            f"(docs/losses.md#addon-bases)")


def markdown_table() -> str:
    """docs/losses.md#addon-bases' table (a test keeps the doc equal to it)."""
    rows = ["| base | clip bounds | published (ε1, ε2) | aggregation | source |", "|---|---|---|---|---|"]
    for b in BASES.values():
        clip = f"({b.clip[0]:g}, {b.clip[1]:g})" if b.clip else "none"
        rows.append(f"| `{b.name}` | {b.clips} | {clip} | `{b.loss_agg_mode}` | {b.source} |")
    return "\n".join(rows) + "\n"


def config_warning(validated) -> Optional[str]:
    """`clip_warning` for a validated run (`rpg.preflight.verl_configs.ValidatedConfig`) whose loss is the KL add-on,
    over its typed `base_loss_mode` (None for any other loss)."""
    settings, actor = validated.rpg, validated.actor
    if settings is None or not str(settings.loss_mode).startswith("rpg_kl_"):
        return None
    return clip_warning(settings.base_loss_mode, float(actor.clip_ratio_low), float(actor.clip_ratio_high))
