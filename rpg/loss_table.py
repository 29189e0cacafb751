"""The loss table: one row per registered RPG policy loss, built from the divergence table.

Registration (`rpg.verl_plugin`), config validation (`rpg.loss_config`), the launcher's rules, `python -m rpg.launch
--list` and the README's loss table all read it. It depends only on `rpg.divergences` and the table of the add-on's
bases (`rpg.addon_bases`, standard library only), so every other module can import it (docs/losses.md for what each
family computes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rpg.addon_bases import BASES
from rpg.divergences import DIVERGENCES, Divergence

#: The Hydra `_target_`s of `rpg.RPGPolicyLossConfig` (`policy_loss._target_`), the public name first. Here, not in
#: `rpg.loss_config`, so that the launcher's rules read it without importing verl.
RPG_POLICY_LOSS_TARGETS = ("rpg.RPGPolicyLossConfig", "rpg.loss_config.RPGPolicyLossConfig")

__all__ = [
    "ADDON", "ADDON_BASES", "DUAL_CLIP", "FAMILIES", "FD", "HARDCLIP", "LOSSES", "RATIO_CLIP", "REFUSED_BASES",
    "REINFORCE", "RPG_POLICY_LOSS_TARGETS", "VERL_CLIP_FIELDS", "Family", "LossSpec", "base_loss_error", "clip_fields",
    "describe_losses", "loss_spec",
]

FD, REINFORCE, HARDCLIP, ADDON = "fd", "reinforce", "hardclip", "addon"
DUAL_CLIP = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")  # ε1, ε2, c
RATIO_CLIP = ("clip_ratio_low", "clip_ratio_high")  # ε1, ε2 (no dual-clip bound)

# verl's own losses that read the clip fields as PPO's ratio clip [1 − ε1, 1 + ε2] (and, for vanilla, the dual-clip
# bound c, which verl asserts > 1 only at the first update): checked at compose time like the RPG rows.
VERL_CLIP_FIELDS = {"vanilla": DUAL_CLIP, "gspo": RATIO_CLIP, "cispo": RATIO_CLIP}

# verl 0.9.1's registered losses the KL add-on (`rpg_kl_<div>`, rpg.kl_addon) runs beside, called exactly as verl calls
# them (docs/losses.md#kl-addon): the rows of `rpg.addon_bases.BASES`; and the ones it refuses with the reason.
ADDON_BASES = tuple(BASES)
REFUSED_BASES = {
    "bypass_mode": "verl's legacy-trainer wrapper: it recomputes the rollout weights itself and the legacy trainer "
                   "rewrites loss_mode to it; with the v1 trainer set algorithm.rollout_correction.bypass_mode=True "
                   "and keep a real base such as vanilla (docs/async.md#bypass)",
}


@dataclass(frozen=True)
class Family:
    """What the losses of one family share. `paper_row` and `authors` may contain `{DIV}` / `{div}`."""

    name: str
    paper_row: str
    description: str
    options: tuple[str, ...]  # RPGPolicyLossConfig options that change this family's loss (besides kl_coef, reference)
    clip_fields: tuple[str, ...]  # verl actor fields the loss reads
    authors: str  # the authors' `kl_loss_type` for the same loss


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(FD, "RPG-{DIV}",
               "dual-clip PPO on the detached `A` plus the unclipped regulariser `β·D̂(w)` (Tables 1/4); "
               "`kl_placement=inside_clip` is the literal Algorithm 1",
               ("kl_placement", "kl_clamp"), DUAL_CLIP, "`rpg_{div}` with `use_kl_loss=True`"),
        Family(REINFORCE, "RPG-REINFORCE-{DIV}",
               "Algorithm 2: `−SG(w·A + C_KL)·log π` with RPG-Style Clip, branching on `A' = A + C_KL/w`, `C_KL` at "
               "the clipped ratio (Remark F.2), flat branches without gradient",
               ("branch_on", "kl_ratio", "kl_credit"), DUAL_CLIP,
               "`rpg_rf_{div}_clip_ppo` (never reached in their code)"),
        Family(HARDCLIP, "— (the authors' `rkl1e-4_rf` script)",
               "`−SG(w̄·A + C_KL(w̄))·log π` on every token: truncated importance weight both ways, no dual clip",
               ("kl_ratio", "kl_credit"), RATIO_CLIP, "`rpg_rf_{div}`, `rpg_rf_{div}_clip_hard`"),
        Family(ADDON, "RPG-{DIV} regulariser + a verl loss",
               "verl's `base_loss_mode` loss, called as verl calls it, plus the exact `β·D̂(w, ρ)` with the token "
               "ratio; `kl_credit=sequence` for the sequence-level KL",
               ("base_loss_mode", "kl_credit"), (), "— (their KL exists only inside their own losses)"),
    )
}


@dataclass(frozen=True)
class LossSpec:
    """One registered RPG policy loss.

    Attributes:
        name: the `policy_loss.loss_mode` name registered in verl's policy-loss registry.
        family: FD (fully differentiable), REINFORCE (Algorithm 2) or HARDCLIP.
        divergence: the row of `rpg.divergences.DIVERGENCES` the loss is built from.
        needs_reference: the loss needs verl's reference model even with `reference=iterative` (`ref_log_prob`).
        options: the `RPGPolicyLossConfig` options that change this loss (`kl_clamp` and `kl_ratio` not for FKL,
            see `_acts_on`); the `ref_refresh_*` options apply to any loss with `reference=periodic` (`rpg.loss_config`).
        clip_fields: the verl actor clip fields the loss reads (validated at compose time and by the loss).
        paper_row, description, authors: for `--list` and the README (the authors' `kl_loss_type`).
    """

    name: str
    family: str
    divergence: Divergence
    needs_reference: bool
    options: tuple[str, ...]
    clip_fields: tuple[str, ...]
    paper_row: str
    description: str
    authors: str


def _acts_on(option: str, div: Divergence) -> bool:
    """Whether a family option acts on `div`: `kl_clamp` only where the authors clamp, `kl_ratio` only where C_KL
    depends on w (not FKL, whose C_KL is the constant ρ)."""
    return {"kl_clamp": div.authors_clamp, "kl_ratio": div.ratio_dependent_kl}.get(option, True)


def _row(name: str, family: str, div: Divergence, needs_reference: bool = False, **text: str) -> LossSpec:
    fam = FAMILIES[family]
    options = ("kl_coef", "reference") + tuple(o for o in fam.options if _acts_on(o, div))
    paper_row = text.get("paper_row", fam.paper_row.format(DIV=div.paper_name))
    authors = text.get("authors", fam.authors.format(div=div.name))
    description = text.get("description", fam.description)
    return LossSpec(name, family, div, needs_reference, options, fam.clip_fields, paper_row, description, authors)


LOSSES: dict[str, LossSpec] = {
    s.name: s
    for s in (
        *(_row(f"rpg_{d.name}", FD, d) for d in DIVERGENCES.values()),
        *(_row(f"rpg_reinforce_{d.name}", REINFORCE, d) for d in DIVERGENCES.values()),
        *(_row(f"rpg_reinforce_hardclip_{d.name}", HARDCLIP, d) for d in DIVERGENCES.values()),
        *(_row(f"rpg_kl_{d.name}", ADDON, d) for d in DIVERGENCES.values()),
        # GRPO's KL made exact (paper §2.2): dual-clip PPO + β·w·k3(π_ref/π_θ) against a frozen/periodic reference.
        _row("grpo_wk3", FD, DIVERGENCES["urkl"], needs_reference=True, paper_row="§2.2 corrected GRPO KL",
             description="dual-clip PPO + `β·w·k3(π_ref/π_θ)` against verl's reference model: GRPO's KL with the "
                         "importance weight it omits (URKL surrogate with ρ = π_ref/π_old)",
             authors="— (their GRPO uses verl's `low_var_kl`)"),
    )
}


def loss_spec(loss_mode: str) -> Optional[LossSpec]:
    """The table row of an RPG loss, None for any other name (verl's own losses)."""
    return LOSSES.get(loss_mode)


def base_loss_error(base_loss_mode: str) -> Optional[str]:
    """Why `base_loss_mode` cannot be the KL add-on's base (None if it can)."""
    where = f"policy_loss.base_loss_mode={base_loss_mode!r}"
    if base_loss_mode in REFUSED_BASES:
        return f"{where} is refused: {REFUSED_BASES[base_loss_mode]}"
    if base_loss_mode in LOSSES:
        return (f"{where} is an RPG loss, which carries its own KL: use it alone, or an `rpg_kl_<div>` row over one of "
                f"verl's losses {list(ADDON_BASES)}")
    if base_loss_mode not in ADDON_BASES:
        return f"{where} is not a base the KL add-on supports; choose one of {list(ADDON_BASES)}"
    return None


def clip_fields(loss_mode: str) -> tuple[str, ...]:
    """The verl actor clip fields `loss_mode` reads and the compose-time check validates (empty: not checked)."""
    spec = loss_spec(loss_mode)
    return spec.clip_fields if spec is not None else VERL_CLIP_FIELDS.get(loss_mode, ())


_CLIP_SYMBOLS = {"clip_ratio_low": "ε1", "clip_ratio_high": "ε2", "clip_ratio_c": "c"}


def describe_losses(markdown: bool = False) -> str:
    """The loss table as text (`python -m rpg.launch --list`) or as the README's markdown table (`--markdown`).

    The markdown groups the rows that agree on everything but the divergence, one line per group.
    """
    if not markdown:
        header = f"{'loss_mode':30} {'family':9} {'div':5} {'ref model':9} {'clip':9} options"
        lines = [header, "-" * len(header)]
        for s in LOSSES.values():
            clip = ",".join(_CLIP_SYMBOLS[f] for f in s.clip_fields) or "base's"
            lines.append(f"{s.name:30} {s.family:9} {s.divergence.name:5} {'needed' if s.needs_reference else '-':9} "
                         f"{clip:9} {', '.join(s.options)}")
        return "\n".join(lines) + "\n"
    groups: dict[tuple, list[LossSpec]] = {}
    for s in LOSSES.values():
        key = (s.family, s.needs_reference, s.options, s.clip_fields, s.description)
        groups.setdefault(key, []).append(s)
    lines = [
        "| loss_mode | paper row | what it is | options (all: `kl_coef`, `reference`, `kl_estimator` with `kl_topk`, "
        "`kl_topk_tail`) | clip | reference model "
        "| authors' `kl_loss_type` |",
        "|---|---|---|---|---|---|---|",
    ]
    for rows in groups.values():
        s, family = rows[0], FAMILIES[rows[0].family]
        names = ", ".join(f"`{r.name}`" for r in rows)
        paper = s.paper_row if len(rows) == 1 else family.paper_row.format(DIV="<DIV>")
        authors = s.authors if len(rows) == 1 else family.authors.format(div="<div>")
        options = ", ".join(f"`{o}`" for o in s.options if o not in ("kl_coef", "reference")) or "—"
        clip = ", ".join(_CLIP_SYMBOLS[f] for f in s.clip_fields) or "the base's"
        ref = "always" if s.needs_reference else "`frozen`/`periodic`/`ema` only"
        lines.append(f"| {names} | {paper} | {s.description} | {options} | {clip} | {ref} | {authors} |")
    return "\n".join(lines) + "\n"
