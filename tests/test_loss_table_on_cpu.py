"""The loss table (rpg/losses.py `LOSSES`) is the one source of truth, and it tells the truth.

It drives registration, the launcher's rules and `--list`, and the README's table (which must equal the
generated one). Its claims are checked against the loss code itself: an option listed for a loss changes that loss's
value or gradient, an option not listed changes neither; a clip field listed is read, `c` is not read by hard-clip.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.workers.config import ActorConfig, PolicyLossConfig

import rpg.losses as L
from rpg.loss_config import RPGPolicyLossConfig, option_defaults
from rpg.divergences import DIVERGENCES

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- loss-table:begin", "<!-- loss-table:end -->"


def test_readme_loss_table_is_the_generated_one():
    text = README.read_text()
    block = text[text.index(BEGIN):text.index(END)]
    table = block.split("\n", 1)[1]
    assert table == L.describe_losses(markdown=True), (
        "README.md's loss table differs from the code: regenerate it with `python -m rpg.launch --list --markdown` "
        "and paste it between the loss-table markers"
    )


def test_every_row_is_registered_and_is_an_rpg_loss():
    rpg_names = {n for n in POLICY_LOSS_REGISTRY if getattr(POLICY_LOSS_REGISTRY[n], "_rpg", False)}
    assert rpg_names == set(L.LOSSES) and "grpo_wk3" in L.LOSSES
    assert not set(L.LOSSES) & {"vanilla", "gspo", "rpg", "rpg_reinforce", "grpo"}


def test_every_family_has_one_row_per_divergence():
    """No family lost a divergence and no row overwrote another (a repeated name keeps only the last row), and each
    row is filed under its own name."""
    assert all(name == spec.name for name, spec in L.LOSSES.items())
    pairs = [(s.family, s.divergence.name) for s in L.LOSSES.values() if not s.needs_reference]
    assert sorted(pairs) == sorted((f, d) for f in L.FAMILIES for d in DIVERGENCES)


def test_list_prints_every_loss(capsys):
    from rpg.launch import main

    main(["--list"])
    text = capsys.readouterr().out
    assert all(re.search(rf"^{n}\s", text, re.M) for n in L.LOSSES)
    main(["--list", "--markdown"])
    assert capsys.readouterr().out == L.describe_losses(markdown=True)


def test_table_names_real_fields():
    rpg_options = set(option_defaults())
    verl_fields = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    assert rpg_options == {f.name for f in dataclasses.fields(RPGPolicyLossConfig)} - verl_fields
    actor_fields = {f.name for f in dataclasses.fields(ActorConfig)}
    for spec in L.LOSSES.values():
        assert set(spec.options) <= rpg_options and {"kl_coef", "reference"} <= set(spec.options)
        assert set(spec.clip_fields) <= actor_fields
    assert all(set(fields) <= actor_fields for fields in L.VERL_CLIP_FIELDS.values())
    assert set(L.VERL_CLIP_FIELDS) <= set(POLICY_LOSS_REGISTRY)


# ---- the table's claims, checked against the loss code --------------------------------------------------------------
NON_DEFAULT = {"kl_clamp": 0.02, "kl_placement": "inside_clip", "branch_on": "advantage", "kl_ratio": "raw"}


# the rows built from the RPG family functions (the KL add-on's rows wrap verl's losses: tests/test_kl_addon_on_cpu.py)
FAMILY_ROWS = sorted(n for n, s in L.LOSSES.items() if not s.needs_reference and s.family != L.ADDON)


def _batch():
    g = torch.Generator().manual_seed(3)
    bs, T = 16, 12
    old = -torch.rand(bs, T, generator=g, dtype=torch.float64) * 3 - 0.05
    log_prob = old + 0.8 * torch.randn(bs, T, generator=g, dtype=torch.float64)
    adv = torch.randn(bs, 1, generator=g, dtype=torch.float64).expand(bs, T).clone()
    adv[:2] = 0.0  # A = 0: branch_on=advantage sends these to the negative branch
    mask = torch.ones(bs, T, dtype=torch.bool)
    return old, log_prob, adv, mask


def _loss_and_grad(spec, clip, **options):
    """The per-token loss and its gradient from the family function a row names, with `options` as keyword args."""
    old, log_prob, adv, mask = _batch()
    lp = log_prob.clone().requires_grad_(True)
    if spec.family == L.FD:
        out = L.rpg_fully_differentiable(lp, old, adv, mask, spec.divergence, 0.5, clip, **options)
    else:
        out = L.rpg_reinforce(lp, old, adv, mask, spec.divergence, 0.5, clip, hard_clip=spec.family == L.HARDCLIP,
                              **options)  # fmt: skip
    (grad,) = torch.autograd.grad(out.loss.sum(), lp)
    return out.loss.detach(), grad


def _accepts(spec, option):
    fn = L.rpg_fully_differentiable if spec.family == L.FD else L.rpg_reinforce
    return option in fn.__code__.co_varnames[: fn.__code__.co_argcount]


@pytest.mark.parametrize("name", FAMILY_ROWS)
@pytest.mark.parametrize("option", sorted(NON_DEFAULT))
def test_an_option_changes_the_loss_iff_the_table_lists_it(name, option):
    spec = L.LOSSES[name]
    clip = L.ClipParams(0.2, 0.28, 3.0)
    if not _accepts(spec, option):
        assert option not in spec.options  # the family function has no such knob at all
        return
    base = _loss_and_grad(spec, clip)
    changed = _loss_and_grad(spec, clip, **{option: NON_DEFAULT[option]})
    same = all(torch.equal(a, b) for a, b in zip(base, changed))
    assert same == (option not in spec.options), (name, option)


@pytest.mark.parametrize("name", FAMILY_ROWS)
def test_c_is_read_iff_the_table_lists_it(name):
    spec = L.LOSSES[name]
    low_c = _loss_and_grad(spec, L.ClipParams(0.2, 0.28, 1.5))
    high_c = _loss_and_grad(spec, L.ClipParams(0.2, 0.28, 50.0))
    same = all(torch.equal(a, b) for a, b in zip(low_c, high_c))
    assert same == ("clip_ratio_c" not in spec.clip_fields), name


def test_grpo_wk3_is_the_urkl_surrogate_against_the_reference():
    spec = L.LOSSES["grpo_wk3"]
    assert (spec.family, spec.divergence.name, spec.needs_reference) == (L.FD, "urkl", True)
    assert spec.options == L.LOSSES["rpg_urkl"].options and spec.clip_fields == L.LOSSES["rpg_urkl"].clip_fields


def test_registered_functions_are_built_from_their_rows():
    for name, spec in L.LOSSES.items():
        entry = POLICY_LOSS_REGISTRY[name]  # rpg.verl_plugin.LazyLoss: the row, and the function built from it
        assert entry.spec is spec
        fn = entry.fn
        assert fn.__name__ == f"compute_policy_loss_{name}" and spec.description in fn.__doc__
