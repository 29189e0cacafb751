"""Every recipe script composes and validates against verl 0.9.1's real config, with the values the paper and the
authors' scripts state (paper App. H; docs/differences.md#s7-5, #authors-scripts), resolves to its golden config
(dry_run_golden.txt), and, on GPU, runs FSDP2 within an 80 GiB memory plan; the schedule-free scripts select the
optimizer, the trainer mode and the plugin module.

Fast path: each script runs in the launcher's print mode (RPG_PRINT_ARGV=1: bash only, prints the final command as
JSON), and its overrides are composed + validated in this process (recipe_helpers: `rpg.launch.compose_config`, then
`rpg.launch.validate`: verl's `validate_config`, verl's dataclasses, the recipe and RPG rules). Every check of every
script is in this module: parallel workers run a module whole, so each script is composed once (about 1 s each). A
few real `RPG_DRY_RUN=1 bash <script>` runs cover the shell → `python -m rpg.launch` path end to end.
"""

from __future__ import annotations

import json
import re
import shlex
import stat
import sys
from pathlib import Path
from typing import NamedTuple, Optional

import pytest
import yaml
from recipe_helpers import (
    RECIPE,
    REPO,
    SCRIPTS_1GPU,
    SCRIPTS_4B,
    SCRIPTS_7B,
    SCRIPTS_CPU,
    cfg_with,
    composed,
    overrides,
    printed,
    run_script,
    validated,
)

import rpg.schedule_free as sfm
from rpg.preflight.gpu import check_memory_plan
from rpg.tools import dry_run_digest as dd

pytestmark = pytest.mark.slow  # a minute or more (every script composed once): scheduled first (tests/conftest.py)

# The authors' 60 scripts as docs/differences.md#authors-scripts documents them (script, model, optimizer, lr, clip,
# family): every script's composed config is checked against that table, so the docs and the recipes agree.
DOCS = REPO / "docs" / "differences.md"
MODELS = {"Math-7B": "Qwen/Qwen2.5-Math-7B", "7B-Instruct": "Qwen/Qwen2.5-7B-Instruct"}
OPTIMS = {"AdamW": "adamw", "schedule-free": "schedulefree"}


class Row(NamedTuple):
    file: str
    model: str
    optim: str
    lr: float
    clip: tuple
    family: str


def _authors_rows() -> list[Row]:
    text = DOCS.read_text()
    section = text[text.index('<a id="authors-scripts"></a>') :]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0].isdigit():
            low, high = (float(x) for x in cells[6].split("/"))
            rows.append(Row(cells[1].strip("`"), MODELS[cells[3]], OPTIMS[cells[4]], float(cells[5]), (low, high),
                            cells[7]))  # fmt: skip
    return rows


AUTHORS_7B = _authors_rows()


def _family(row: Row) -> tuple:
    """(adv, loss, β, verl KL loss, dynamic sampling, overlong, token-budget factor) of a docs family row; the
    divergence from the script's name (`rpg_7b_<div>1e-4`)."""
    div = re.match(r"run_rpg_7b_([a-z]+)1e-4", row.file)[1] if row.family in "FRH" else None
    return {
        "D": ("grpo", "vanilla", None, None, True, True, 1),
        "G": ("grpo", "vanilla", None, ("low_var_kl", 1e-3), False, False, 1),
        "P": ("reinforce_plus_plus" + ("_baseline" if row.file.startswith("run_rfppb") else ""), "vanilla", None,
              ("kl", 1e-4), True, True, 1),
        "F": ("rpg", f"rpg_{div}", 1e-4, None, True, True, 1),
        "Z": ("rpg", "rpg_ufkl", 0.0, None, True, True, 1),
        "R": ("rpg", f"rpg_reinforce_{div}", 1e-4, None, True, True, 4),
        "H": ("rpg", f"rpg_reinforce_hardclip_{div}", 1e-4, None, True, True, 1),
    }[row.family]  # fmt: skip


# The paper's Qwen3-4B runs (paper App. H, Tables 3, 5–7): method stem → (adv_estimator, loss_mode, β, clip low/high,
# verl KL loss, dynamic sampling, overlong). Every method exists at 2K, 4K and 8K (`run_<stem>_<ctx>k.sh`).
PAPER_4B = {
    "grpo": ("grpo", "vanilla", None, (0.2, 0.2), ("low_var_kl", 1e-3), False, False),
    "dapo": ("grpo", "vanilla", None, (0.2, 0.28), None, True, True),
    "rfpp": ("reinforce_plus_plus", "vanilla", None, (0.2, 0.28), ("kl", 1e-4), True, True),
    "rfppb": ("reinforce_plus_plus_baseline", "vanilla", None, (0.2, 0.28), ("kl", 1e-4), True, True),
    "rpg_ufkl": ("rpg", "rpg_ufkl", 1e-4, (0.2, 0.28), None, True, True),
    "rpg_urkl": ("rpg", "rpg_urkl", 1e-4, (0.2, 0.28), None, True, True),
    "rpg_reinforce_ufkl": ("rpg", "rpg_reinforce_ufkl", 1e-4, (0.2, 0.28), None, True, True),
    "rpg_reinforce_urkl": ("rpg", "rpg_reinforce_urkl", 1e-4, (0.2, 0.28), None, True, True),
}
ABLATIONS_4B = {  # Fig. 8 (2K clip) and Fig. 9 (4K β and reference): script → (loss_mode, β, clip, ctx, reference)
    "run_rpg_reinforce_ufkl_2k_clip0.1_0.1.sh": ("rpg_reinforce_ufkl", 1e-4, (0.1, 0.1), 2, "iterative"),
    "run_rpg_reinforce_urkl_2k_clip0.1_0.1.sh": ("rpg_reinforce_urkl", 1e-4, (0.1, 0.1), 2, "iterative"),
    "run_rpg_reinforce_ufkl_4k_beta1e-3.sh": ("rpg_reinforce_ufkl", 1e-3, (0.2, 0.28), 4, "iterative"),
    "run_rpg_reinforce_ufkl_4k_beta1e-3_noiterref.sh": ("rpg_reinforce_ufkl", 1e-3, (0.2, 0.28), 4, "frozen"),
    # the paper's §5 periodic scheme (no table row): refresh every K = 64 optimizer steps
    "run_rpg_reinforce_urkl_4k_periodic.sh": ("rpg_reinforce_urkl", 1e-4, (0.2, 0.28), 4, "periodic"),
    # the paper's best configuration on verl's colocated asynchronous trainer with token TIS (docs/async.md#modes)
    "run_rpg_reinforce_urkl_4k_async.sh": ("rpg_reinforce_urkl", 1e-4, (0.2, 0.28), 4, "iterative"),
    # beyond the paper: the EMA reference, the adaptive β, sequence KL credit, GSPO + the exact URKL add-on
    "run_rpg_reinforce_urkl_4k_ema.sh": ("rpg_reinforce_urkl", 1e-4, (0.2, 0.28), 4, "ema"),
    "run_rpg_reinforce_urkl_4k_adaptive_beta.sh": ("rpg_reinforce_urkl", 1e-4, (0.2, 0.28), 4, "iterative"),
    "run_rpg_reinforce_urkl_4k_seqkl.sh": ("rpg_reinforce_urkl", 1e-4, (0.2, 0.28), 4, "iterative"),
    "run_gspo_urkl_4k.sh": ("rpg_kl_urkl", 1e-4, (3e-4, 4e-4), 4, "iterative"),
    # beyond the paper: RPG-URKL 4K with the top-k KL at the paper's β (docs/losses.md#topk-use)
    "run_rpg_urkl_4k_topk.sh": ("rpg_urkl", 1e-4, (0.2, 0.28), 4, "iterative"),
}
GPU_SCRIPTS = SCRIPTS_7B + SCRIPTS_4B + SCRIPTS_1GPU
ALL_SCRIPTS = GPU_SCRIPTS + SCRIPTS_CPU


def _is_schedulefree(script: Path) -> bool:
    return "schedulefree" in script.name


def _check(cfg, adv, loss, beta, clip, kl, dynamic, overlong):
    actor = cfg.actor_rollout_ref.actor
    assert cfg.algorithm.adv_estimator == adv
    assert actor.policy_loss.loss_mode == loss
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (*clip, 10.0)
    if beta is None:
        assert actor.policy_loss._target_ == "verl.workers.config.PolicyLossConfig"
    else:
        assert actor.policy_loss._target_ == "rpg.RPGPolicyLossConfig"
        assert actor.policy_loss.kl_coef == beta
    if kl:  # verl's own KL loss against its frozen reference model (GRPO, REINFORCE++)
        assert (actor.use_kl_loss, actor.kl_loss_type, actor.kl_loss_coef) == (True, *kl)
    else:  # DAPO: no KL; RPG: the KL is in the loss, against π_old (iterative reference), no reference model
        assert actor.use_kl_loss is False
    assert cfg.algorithm.filter_groups.enable is dynamic
    assert cfg.reward.reward_kwargs.overlong_buffer_cfg.enable is overlong
    assert cfg.algorithm.use_kl_in_reward is False


# --------------------------------------------------------------------------------------------------------------
def test_the_authors_scripts_are_the_documented_ones():
    """recipe/rpg/7b/ holds exactly the scripts docs/differences.md#authors-scripts numbers, in its order."""
    from rpg.recipe_table import AUTHORS_7B as TABLE

    numbered = [row.file for row in AUTHORS_7B]
    assert numbered == sorted(numbered), "the docs number the scripts in alphabetical order"
    assert sorted(p.name for p in SCRIPTS_7B) == numbered == sorted(r.path.split("/")[1] for r in TABLE)


def test_every_4b_paper_row_has_a_script():
    expected = {f"run_{stem}_{ctx}k.sh" for stem in PAPER_4B for ctx in (2, 4, 8)} | set(ABLATIONS_4B)
    assert sorted(p.name for p in SCRIPTS_4B) == sorted(expected)


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_passes_dry_run(script: Path):
    """Composes + validates (verl's checks, dataclasses, recipe and RPG rules)."""
    v = validated(script)
    assert v.actor is not None and v.rollout is not None


# ---- the golden configs (rpg/tools/dry_run_digest.py) -------------------------------------------------------------
# The launcher's plumbing (common.sh, rpg.launch, rpg.preflight) may be rewritten freely; what a recipe runs may not
# change by accident. Each script's resolved config, normalised (the checkout's directory written `<repo>`), hashes to
# its line of dry_run_golden.txt. A deliberate change regenerates the file in the same commit and says why.
GOLDEN = Path(__file__).with_name("dry_run_golden.txt")


def test_golden_lists_every_recipe_script():
    assert sorted(dd.read_golden(GOLDEN)) == sorted(dd.name(s) for s in dd.scripts()) == sorted(
        dd.name(s) for s in ALL_SCRIPTS)


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_resolves_to_its_golden_config(script: Path):
    assert dd.digest(dd.normalised(composed(script))) == dd.read_golden(GOLDEN)[dd.name(script)], (
        f"{dd.name(script)} resolves to a different dry-run config than {GOLDEN.name}. See what changed: "
        "python -m rpg.tools.dry_run_digest --yaml-dir /tmp/new, the same on the previous commit with --yaml-dir "
        "/tmp/old, then diff -r /tmp/old /tmp/new. If the change is deliberate: "
        "python -m rpg.tools.dry_run_digest --write tests/recipes/dry_run_golden.txt"
    )


def test_the_digest_sees_a_changed_setting():
    """The comparison can fail: one changed override changes the digest; the tool's own path (a fresh print of the
    script, a fresh composition) gives the golden digest."""
    script = RECIPE / "4b" / "run_dapo_2k.sh"
    base = dd.digest(dd.normalised_yaml(dd.script_overrides(script)))
    assert base == dd.read_golden(GOLDEN)[dd.name(script)]
    assert dd.digest(dd.normalised_yaml(overrides(script) + ["trainer.test_freq=11"])) != base


# ---- what the launcher derives from a validated config (rpg/tools/dry_run_digest.py: plan_text) ---------------------
# The dry run's summary, the checkpoint-disk estimate, the GPU memory plan (both cross-entropy paths, 80 GiB) and the
# smoke overrides of every recipe hash to their line of dry_run_plan_golden.txt: the consumers of the typed config may
# be rewritten, their answers may not change by accident.
PLAN_GOLDEN = Path(__file__).with_name("dry_run_plan_golden.txt")
PLAN_HINT = ("python -m rpg.tools.dry_run_digest --plans --yaml-dir /tmp/new, the same on the previous commit with "
             "--yaml-dir /tmp/old, then diff -r /tmp/old /tmp/new; if the change is deliberate: python -m "
             "rpg.tools.dry_run_digest --plans --write tests/recipes/dry_run_plan_golden.txt")


def test_plan_golden_lists_every_recipe_script():
    assert sorted(dd.read_golden(PLAN_GOLDEN)) == sorted(dd.name(s) for s in ALL_SCRIPTS)


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_summary_disk_plan_and_smoke_are_golden(script: Path):
    with dd.fixed_machine():
        text = dd.plan_text(validated(script))
    assert dd.digest(text) == dd.read_golden(PLAN_GOLDEN)[dd.name(script)], f"{dd.name(script)}:\n{text}\n{PLAN_HINT}"


def test_the_plan_digest_sees_a_changed_setting():
    """The comparison can fail: a changed memory setting changes the text's digest."""
    from rpg.launch import validate

    script = RECIPE / "4b" / "run_rpg_urkl_4k_topk.sh"
    with dd.fixed_machine():
        changed = dd.plan_text(validate(cfg_with(composed(script), {"actor_rollout_ref.actor.policy_loss.kl_topk": 32})))
    assert dd.digest(changed) != dd.read_golden(PLAN_GOLDEN)[dd.name(script)]
    assert "k 32 (π_old's top-k)" in changed


# ---- the GPU scripts: FSDP2 everywhere, a memory plan within 80 GiB (rpg/preflight/gpu.py) -------------------------
@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_gpu_recipe_runs_actor_and_reference_on_fsdp2(script):
    arr = validated(script).config.actor_rollout_ref
    assert (arr.actor.strategy, arr.ref.strategy) == ("fsdp2", "fsdp2")


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_gpu_recipe_plans_within_80_gib(script, capsys):
    v = validated(script)
    capsys.readouterr()
    # docs/differences.md#d28; one GPU (docs/gpu.md#lora): the frozen fp32 base stays beside vLLM during the rollout
    expected = {"7b": 0.75, "4b": 0.8}.get(script.parent.name) or (0.75 if "1_7b" in script.name else 0.65)
    assert v.config.actor_rollout_ref.rollout.gpu_memory_utilization == expected
    plan = check_memory_plan(v, budget_gib=80)
    assert plan is not None and plan.problems() == []
    assert max(plan.rollout_gib, plan.update_gib) <= plan.limit_gib - 4  # 4 GiB under the limit (sampler counted)
    assert capsys.readouterr().err == plan.line() + "\n"


# ---- the schedule-free scripts (rpg/schedule_free.py; docs/schedule-free.md) -------------------------------------
SF_SCRIPTS = [p for p in ALL_SCRIPTS if _is_schedulefree(p)]
SF_EXPECTED = {"optimizer_impl": "schedulefree", "optimizer": "AdamWScheduleFree", "use_v1": True,
               "trainer_mode": sfm.TRAINER_MODE}  # fmt: skip


def test_the_authors_schedule_free_scripts_exist():
    documented = sorted(row.file for row in AUTHORS_7B if row.optim == "schedulefree")  # docs/differences.md
    assert sorted(p.name for p in SF_SCRIPTS if p.parent.name == "7b") == documented and documented


@pytest.mark.parametrize("script", SF_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_schedule_free_script_selects_optimizer_trainer_and_module(script):
    argv = printed(script)["argv"]
    assert "optim=schedulefree" in argv  # the group (rpg/config/optim/schedulefree.yaml)
    v = validated(script)
    # nothing after the group switches back to AdamW or to another trainer
    cfg = v.config
    got = {"optimizer_impl": cfg.actor_rollout_ref.actor.optim.optimizer_impl, "use_v1": cfg.trainer.use_v1,
           "optimizer": cfg.actor_rollout_ref.actor.optim.optimizer, "trainer_mode": cfg.trainer.v1.trainer_mode}
    assert got == SF_EXPECTED
    assert sfm.check_config(v.config) is True
    assert "schedule_free" in v.install  # every process of the run registers the trainer (rpg.install)
    optim = v.actor.optim
    assert (optim.weight_decay, tuple(optim.betas), optim.lr_warmup_steps, optim.lr_scheduler_type) == (
        0.1, (0.9, 0.999), 10, "constant")


@pytest.mark.parametrize("row", AUTHORS_7B, ids=lambda r: r.file)
def test_7b_values_match_the_documented_table(row: Row):
    name, model, optim, lr = row.file, row.model, row.optim, row.lr
    adv, loss, beta, kl, dynamic, overlong, factor = _family(row)
    script = RECIPE / "7b" / name
    cfg = validated(script).config
    _check(cfg, adv, loss, beta, row.clip, kl, dynamic, overlong)
    actor = cfg.actor_rollout_ref.actor
    assert actor.optim.lr == lr
    assert cfg.actor_rollout_ref.model.path == model
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (2048, 2048)
    assert actor.ppo_max_token_len_per_gpu == factor * 4096
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == factor * 4096
    assert cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == factor * 4096
    assert [Path(f).name for f in cfg.data.val_files] == ["amc-2023.parquet", "aime-2024.parquet", "aime-2025.parquet"]
    assert (_is_schedulefree(script), optim) in ((True, "schedulefree"), (False, "adamw"))
    got = (actor.optim.optimizer_impl, actor.optim.optimizer, cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode)
    if optim == "adamw":
        assert got[:2] == ("torch.optim", "AdamW") and got[2] != "schedule_free_sync", got
    else:  # never silently AdamW
        assert got == ("schedulefree", "AdamWScheduleFree", "schedule_free_sync"), got


def test_7b_hard_clip_rf_script_token_budget_is_p_plus_r():
    """The authors' run_rpg_7b_rkl1e-4_rf.sh sets all three dynamic-batch budgets (actor, rollout and ref
    log-prob) to max_prompt_length + max_response_length; only their *_rf_clip_ppo* scripts use 4·(P+R)."""
    cfg = validated(RECIPE / "7b" / "run_rpg_7b_rkl1e-4_rf.sh").config
    p_plus_r = cfg.data.max_prompt_length + cfg.data.max_response_length
    arr = cfg.actor_rollout_ref
    budgets = (arr.actor.ppo_max_token_len_per_gpu, arr.rollout.log_prob_max_token_len_per_gpu,
               arr.ref.log_prob_max_token_len_per_gpu)
    assert budgets == (p_plus_r,) * 3 == (4096,) * 3
    clip_ppo = validated(RECIPE / "7b" / "run_rpg_7b_rkl1e-4_rf_clip_ppo.sh").config.actor_rollout_ref
    assert clip_ppo.actor.ppo_max_token_len_per_gpu == 4 * p_plus_r


@pytest.mark.parametrize("stem", sorted(PAPER_4B))
@pytest.mark.parametrize("ctx", (2, 4, 8))
def test_4b_values_match_paper(stem: str, ctx: int):
    cfg = validated(RECIPE / "4b" / f"run_{stem}_{ctx}k.sh").config
    adv, loss, beta, clip, kl, dynamic, overlong = PAPER_4B[stem]
    _check(cfg, adv, loss, beta, clip, kl, dynamic, overlong)
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6  # paper App. H: 1e-6 for every method
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen3-4B"
    assert cfg.data.max_prompt_length == cfg.data.max_response_length == ctx * 1024
    assert cfg.reward.reward_kwargs.max_resp_len == ctx * 1024
    assert cfg.reward.reward_kwargs.overlong_buffer_cfg.len == ctx * 256
    sets = ["aime-2024", "aime-2025", "amc-2023"] + (["minerva-math", "olympiadbench"] if ctx == 4 else [])
    assert [Path(f).stem for f in cfg.data.val_files] == sets  # Table 7 (Minerva, OlympiadBench) is 4K only


@pytest.mark.parametrize("name", sorted(ABLATIONS_4B))
def test_4b_ablations(name: str):
    v = validated(RECIPE / "4b" / name)
    loss, beta, clip, ctx, reference = ABLATIONS_4B[name]
    cfg, actor = v.config, v.config.actor_rollout_ref.actor
    assert (actor.policy_loss.loss_mode, v.rpg.kl_coef, v.rpg.reference) == (loss, beta, reference)
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == clip
    assert cfg.data.max_response_length == ctx * 1024
    # no iterative reference: verl builds the frozen reference model (use_kl_loss) but adds no KL itself (coef 0)
    with_model = reference in ("frozen", "periodic", "ema")
    assert (actor.use_kl_loss, actor.kl_loss_coef) == ((True, 0.0) if with_model else (False, 0.0))
    assert (v.ref is not None) is with_model
    if reference == "periodic":
        assert (v.rpg.ref_refresh_steps, v.rpg.ref_refresh_kl) == (64, 0.0)
    if reference == "ema":
        assert (v.rpg.ref_ema_decay, v.rpg.ref_ema_period) == (0.99, 16)
    expected = {"adaptive_beta": ("adaptive", 1e-3, 10.0), "seqkl": "sequence", "gspo": ("gspo", "seq-mean-token-mean")}
    got = {"adaptive_beta": (v.rpg.kl_control, v.rpg.kl_target, v.rpg.kl_horizon), "seqkl": v.rpg.kl_credit,
           "gspo": (v.rpg.base_loss_mode, actor.loss_agg_mode)}
    for key in expected:
        assert (got[key] == expected[key]) is (key in name), key  # each setting only in its own script
    assert ("worker_hooks" in v.install) is (reference in ("periodic", "ema") or "adaptive" in name)
    assert v.rpg is v.actor.policy_loss  # built once, with the actor; the RPG rules and rpg.install read that object


def test_the_rpg_settings_are_built_once_per_validation(monkeypatch):
    """`rpg.launch.validate` (what a dry run and a launch run) builds `RPGPolicyLossConfig` once, with the typed actor
    config, and passes that object to the RPG rules and to `rpg.install.selected`; the only other construction is
    the one inside verl's own `validate_config`, which the launcher runs exactly as verl's main_ppo does."""
    import traceback

    from rpg.launch import validate
    from rpg.loss_config import RPGPolicyLossConfig

    built, post_init = [], RPGPolicyLossConfig.__post_init__

    def counted(self):
        built.append((self, any(f.name == "validate_config" for f in traceback.extract_stack())))
        post_init(self)

    monkeypatch.setattr(RPGPolicyLossConfig, "__post_init__", counted)
    v = validate(composed(RECIPE / "4b" / "run_rpg_reinforce_urkl_4k_periodic.sh"))
    assert v.install == ("ref_log_prob", "worker_hooks")
    assert [obj for obj, in_verl in built if not in_verl] == [v.rpg] and len(built) == 2


# The authors' trainer and engine settings that no script of theirs passes (their verl's defaults; docs/differences.md
# D24, D25): training prompts shuffled with seed 1, vLLM seeded with 0, at most 1024 sequences per engine step. The
# paper states none of them, so the 4B scripts take the authors' values too.
AUTHORS_SEEDS = {"data_seed": 1, "rollout_seed": 0, "max_num_seqs": 1024}


@pytest.mark.parametrize("script", SCRIPTS_7B + SCRIPTS_4B + SCRIPTS_1GPU, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_authors_seeds_and_engine_size(script: Path):
    v = validated(script)
    got = {"data_seed": v.config.data.seed, "rollout_seed": v.rollout.seed, "max_num_seqs": v.rollout.max_num_seqs}
    assert got == AUTHORS_SEEDS


@pytest.mark.parametrize("seed", (None, "7"))
def test_cpu_seed_still_drives_the_cpu_runs(seed):
    """The CPU profile composes the same yaml: CPU_SEED (default 0), not the GPU recipes' seeds, seeds a CPU run."""
    from rpg.launch import compose_config

    env = {"RPG_PRINT_ARGV": "1", "RPG_PROFILE": "cpu"} | ({"CPU_SEED": seed} if seed else {})
    for script in SCRIPTS_CPU:
        proc = run_script(script, **env)
        assert proc.returncode == 0, proc.stderr
        cfg = compose_config(json.loads(proc.stdout)["argv"][3:])
        assert cfg.data.seed == cfg.actor_rollout_ref.rollout.seed == int(seed or 0), script.name


# --------------------------------------------------------------------------------------------------------------
# Qwen3-4B thinking mode: an explicit knob of the 4B scripts (THINKING, default false; docs/differences.md D26)
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", SCRIPTS_4B, ids=lambda p: p.name)
def test_4b_scripts_render_without_thinking_by_default(script: Path):
    assert validated(script).config.data.apply_chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("script", SCRIPTS_7B, ids=lambda p: p.name)
def test_7b_scripts_pass_no_chat_template_kwargs(script: Path):
    """The authors rendered with the template's defaults; Qwen2.5's templates have no thinking mode."""
    assert validated(script).config.data.apply_chat_template_kwargs == {}


@pytest.mark.parametrize("value, expected", [("true", True), ("false", False), ("True", True)])
def test_thinking_knob_sets_enable_thinking(value: str, expected: bool):
    from rpg.launch import compose_and_validate

    proc = run_script(RECIPE / "4b" / "run_rpg_reinforce_urkl_8k.sh", RPG_PRINT_ARGV="1", THINKING=value)
    assert proc.returncode == 0, proc.stderr
    cfg = compose_and_validate(json.loads(proc.stdout)["argv"][3:]).config
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": expected}


@pytest.mark.parametrize("value", ["maybe", "1", "on", "'false'"])
def test_bad_thinking_value_is_refused_before_launch(value: str):
    from rpg.launch import RecipeConfigError, compose_and_validate

    proc = run_script(RECIPE / "4b" / "run_dapo_2k.sh", RPG_PRINT_ARGV="1", THINKING=value)
    assert proc.returncode == 0, proc.stderr  # bash passes it on; rpg.launch refuses it before Ray starts
    with pytest.raises(RecipeConfigError) as info:
        compose_and_validate(json.loads(proc.stdout)["argv"][3:])
    message = str(info.value)
    assert "THINKING" in message and "data.apply_chat_template_kwargs.enable_thinking" in message, message
    assert "true, false" in message, message


def test_thinking_knob_is_refused_outside_the_4b_scripts():
    proc = run_script(RECIPE / "7b" / "run_dapo_7b.sh", RPG_PRINT_ARGV="1", THINKING="true")
    assert proc.returncode == 2 and "THINKING" in proc.stderr and "setup=qwen3_4b" in proc.stderr, proc.stderr


# The branch of Qwen3's chat template that `enable_thinking` selects (written here; nothing is downloaded): the
# generation prompt gets an empty think block, so the model answers without thinking, only when it is `false`.
QWEN3_LIKE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.mark.parametrize("thinking, evaluate_kwargs", [(None, '{"enable_thinking": false}'),
                                                       ("true", '{"enable_thinking": true}')])  # fmt: skip
def test_thinking_reaches_verls_prompt_rendering_and_rpg_evaluate(thinking, evaluate_kwargs: str):
    """`data.apply_chat_template_kwargs` is what verl 0.9.1's agent loop renders training and validation prompts with
    (`AgentLoopWorker` hands `config.data.apply_chat_template_kwargs` to its Continuous-Token builder); rpg-evaluate,
    given the README's `--chat-template-kwargs`, renders the same prompt ids."""
    from cpu_trainer import ensure_tiny_model
    from rpg.launch import compose_and_validate
    from rpg.tools.evaluate import Problem, SamplingSettings, render_prompts
    from transformers import AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    env = {"RPG_PRINT_ARGV": "1"} | ({"THINKING": thinking} if thinking else {})
    proc = run_script(RECIPE / "4b" / "run_rpg_urkl_4k.sh", **env)
    data_config = compose_and_validate(json.loads(proc.stdout)["argv"][3:]).config.data
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model() / "model")
    tokenizer.chat_template = QWEN3_LIKE_TEMPLATE
    messages = [{"role": "user", "content": "What is 1+1?"}]
    builder = create_continuous_token_builder(
        tokenizer, hf_model_type="qwen3", chat_template_kwargs=data_config.get("apply_chat_template_kwargs", {})
    )  # as verl/experimental/agent_loop/agent_loop.py builds it
    training = builder.build_initial_tokens(messages)
    assert tokenizer.decode(training).endswith("<think>\n\n</think>\n\n") is (thinking is None)
    problem = Problem(data_source="math_dapo", messages=messages, ground_truth="2", extra_info=None, file="-")
    settings = SamplingSettings(chat_template_kwargs=json.loads(evaluate_kwargs))
    assert render_prompts([problem], tokenizer, "qwen3", settings)[0] == [list(training)]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"enable_thinking": False}, "thinking off"),
        ({"enable_thinking": True}, "thinking on"),
        ({}, "the template's default"),
    ],
)
def test_chat_template_summary(kwargs: dict, needle: str):
    from omegaconf import OmegaConf

    from rpg.launch import chat_template_summary

    line = chat_template_summary(OmegaConf.create({"data": {"apply_chat_template_kwargs": kwargs}}))
    assert needle in line and "data.apply_chat_template_kwargs=" in line, line
    assert repr(kwargs) in line or str(kwargs) in line, line


def test_common_paper_hyperparameters():
    """Paper App. H / docs/differences.md#s7-5 settings shared by every script (checked on one; they come from one
    place, rpg/config/rpg_trainer.yaml, and common.sh for the context-dependent ones)."""
    v = validated(RECIPE / "4b" / "run_rpg_reinforce_urkl_8k.sh")
    cfg, actor, rollout = v.config, v.config.actor_rollout_ref.actor, v.config.actor_rollout_ref.rollout
    assert (cfg.data.train_batch_size, rollout.n, actor.ppo_mini_batch_size, actor.ppo_epochs) == (512, 16, 32, 1)
    assert (actor.loss_agg_mode, actor.entropy_coeff, actor.use_dynamic_bsz) == ("token-mean", 0, True)
    assert (actor.optim.lr_warmup_steps, actor.optim.weight_decay, actor.optim.clip_grad) == (10, 0.1, 1.0)
    assert actor.optim.lr_scheduler_type == "constant"
    assert (rollout.name, rollout.temperature, rollout.top_p, rollout.top_k) == ("vllm", 1.0, 1.0, -1)
    val = rollout.val_kwargs
    assert (val.n, val.do_sample, val.temperature, val.top_p, val.top_k) == (1, True, 1.0, 1.0, -1)
    model = cfg.actor_rollout_ref.model
    assert (model.use_remove_padding, model.enable_gradient_checkpointing) == (True, True)
    t = cfg.trainer
    assert (t.total_training_steps, t.test_freq, t.save_freq, t.val_before_train) == (400, 10, 20, True)
    assert list(t.logger) == ["console", "wandb"]
    assert (cfg.algorithm.filter_groups.metric, cfg.algorithm.filter_groups.max_inflight_gen_batches) == ("acc", 3)
    assert cfg.reward.reward_manager.name == "dapo"
    assert (cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name) == (
        "pkg://rpg.data.reward",
        "compute_score",
    )
    assert cfg.reward.reward_kwargs.overlong_buffer_cfg.penalty_factor == 1.0
    assert cfg.data.truncation == "left"
    assert v.ref is None and v.rpg.reference == "iterative"  # iterative reference: no reference model is built
    assert cfg.trainer.experiment_name == "run_rpg_reinforce_urkl_8k"


# --------------------------------------------------------------------------------------------------------------
# Bad input fails in the dry run, with a message naming what is wrong
# --------------------------------------------------------------------------------------------------------------
def _bad():
    """(extra overrides, the error the contract promises, text it must contain): Hydra rejects an unknown key of
    verl's yaml, verl's dataclasses (through Hydra's instantiate) an invalid value or an unknown key of theirs,
    OmegaConf an unknown model key, rpg.launch (RecipeConfigError) every RPG and recipe rule and every value the RPG
    options' own validation refuses."""
    from hydra.errors import ConfigCompositionException, InstantiationException
    from omegaconf.errors import ConfigKeyError

    from rpg.launch import RecipeConfigError

    return [
        (["actor_rollout_ref.actor.clip_ratio_lo=0.1"], ConfigCompositionException, "clip_ratio_lo"),
        (["+actor_rollout_ref.actor.policy_loss.kl_coeff=1e-3"], InstantiationException, "kl_coeff"),
        (["+actor_rollout_ref.actor.policy_loss.kl_coef=-1"], RecipeConfigError, "kl_coef"),
        (["+actor_rollout_ref.actor.policy_loss.reference=frozn"], RecipeConfigError, "reference"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_kl"], RecipeConfigError, "rpg_reinforce_urkl"),
        (["algorithm.adv_estimator=rpg_mean"], RecipeConfigError, "rpg_batchmean"),
        (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=1e-3"], RecipeConfigError,
         "use_kl_loss=False"),
        (["actor_rollout_ref.actor.loss_agg_mode=token_mean"], InstantiationException, "token_mean"),
        (["+reward.reward_kwargs.overlong_buffer_cfg.lenght=3"], RecipeConfigError, "lenght"),
        (["reward.reward_manager.name=dapoo"], RecipeConfigError, "dapoo"),
        (["algorithm.rollout_correction.bypass_mode=True", "trainer.use_v1=False", "algorithm.filter_groups.enable=False"],
         RecipeConfigError, "bypass_mode=True in verl's legacy trainer"),
        (["+actor_rollout_ref.model.override_config_typo=1"], ConfigKeyError, "override_config_typo"),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(12))
def test_bad_override_fails_with_clear_message(index: int):
    from rpg.launch import compose_and_validate

    extra, error, needle = _bad()[index]
    base = overrides(RECIPE / "4b" / "run_rpg_reinforce_urkl_2k.sh")
    with pytest.raises(error) as info:
        compose_and_validate(base + extra)
    message = f"{info.value} {info.value.__cause__!r}"
    assert needle in message, message


def test_overrides_can_reset_keys_common_sh_added():
    """`+key=value` on the command line works for keys common.sh already added (rpg.launch treats + as ++)."""
    from rpg.launch import compose_and_validate

    base = overrides(RECIPE / "4b" / "run_rpg_reinforce_urkl_2k.sh")
    v = compose_and_validate(base + ["+actor_rollout_ref.actor.policy_loss.kl_coef=1e-3"])
    assert v.rpg.kl_coef == 1e-3


# --------------------------------------------------------------------------------------------------------------
# Shell-level behaviour (bash only, fast)
# --------------------------------------------------------------------------------------------------------------
def _script(tmp_path: Path, choices: str) -> Path:
    """A throwaway experiment script in recipe/rpg/<tmp>/ layout: it sources the real common.sh with `choices`."""
    p = tmp_path / "probe" / "run_probe.sh"
    p.parent.mkdir(exist_ok=True)
    p.write_text(f'source "{RECIPE}/common.sh" {choices} "$@"\n')
    return p


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"RPG_PROFILE": "tpu"}, "RPG_PROFILE='tpu' is not valid; choose one of: gpu cpu"),
        ({"OPTIM": "sgd"}, "OPTIM='sgd' is not valid; choose one of: adamw schedulefree"),
        ({"CTX": "8"}, "CTX exported"),
    ],
)
def test_launcher_errors_are_clear(tmp_path: Path, env: dict, needle: str):
    proc = run_script(_script(tmp_path, "method=dapo"), RPG_PRINT_ARGV="1", **env)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "choices, needle, error",
    [
        (["method=rpg_reinforce", "recipe.divergence=kl", "recipe.beta=1e-4"], "rpg_reinforce_urkl",
         "RecipeConfigError"),
        (["setup=qwen3_4b_3k"], "qwen3_4b_4k", "MissingConfigException"),  # Hydra lists the group's options
        (["setup=authors_7b_base"], "authors_7b_instruct", "MissingConfigException"),
        (["optim=sgd"], "schedulefree", "MissingConfigException"),
        # β is the method's: never silently a default
        (["method=rpg", "recipe.divergence=ufkl"], "recipe.beta", "InterpolationKeyError"),
    ],
)
def test_bad_group_choices_are_refused_before_launch(choices: list, needle: str, error: str):
    from hydra.errors import MissingConfigException
    from omegaconf.errors import InterpolationKeyError

    from rpg.launch import RecipeConfigError, compose_and_validate

    errors = {e.__name__: e for e in (RecipeConfigError, MissingConfigException, InterpolationKeyError)}
    base = overrides(RECIPE / "cpu" / "run_dapo.sh")
    with pytest.raises(errors[error]) as info:
        compose_and_validate(base + choices)
    message = f"{info.value} {info.value.__cause__!r}"
    assert needle in message, message


def test_order_of_overrides_and_plugin_env(tmp_path: Path):
    """rpg_trainer.yaml < the groups < the script's line < command line; the plugin is loaded by every process."""
    from rpg.launch import compose_config

    script = _script(tmp_path, "method=dapo actor_rollout_ref.actor.optim.lr=2e-6 trainer.test_freq=5")
    proc = run_script(script, "actor_rollout_ref.actor.optim.lr=3e-6", RPG_PRINT_ARGV="1",
                      VERL_USE_EXTERNAL_MODULES="rpg.cpu.platform")  # fmt: skip
    data = json.loads(proc.stdout)
    lr = [a.split("=")[1] for a in data["argv"] if a.startswith("actor_rollout_ref.actor.optim.lr=")]
    assert lr == ["2e-6", "3e-6"]  # the script's, the command line's (the yaml's 1e-6 is not repeated)
    assert not [a for a in data["argv"] if a.startswith("trainer.test_freq=10")]
    cfg = compose_config(data["argv"][3:])
    assert (cfg.actor_rollout_ref.actor.optim.lr, cfg.trainer.test_freq) == (3e-6, 5)
    assert compose_config([]).trainer.test_freq == 10  # rpg_trainer.yaml
    assert data["env"]["VERL_USE_EXTERNAL_MODULES"] == "rpg.cpu.platform,rpg.verl_plugin"
    assert data["ray_address"] == ""


def _fake_python(path: Path) -> Path:
    """A `python` that records the argv of `-m rpg.launch` (and VERL_USE_EXTERNAL_MODULES, PYTHONPATH) as JSON in
    $FAKE_OUT; anything else (common.sh's `-m rpg.preflight.recipe_argv`) runs in this test's interpreter."""
    exe = path / "python"
    exe.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "if sys.argv[1:3] != ['-m', 'rpg.launch']:\n"
        f"    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
        "json.dump({'argv': sys.argv[1:], 'plugins': os.environ.get('VERL_USE_EXTERNAL_MODULES'),"
        " 'pythonpath': os.environ.get('PYTHONPATH', '')}, open(os.environ['FAKE_OUT'], 'w'))\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_local_run_invokes_rpg_launch(tmp_path: Path):
    out = tmp_path / "out.json"
    fake_python = _fake_python(tmp_path)
    script = RECIPE / "4b" / "run_dapo_2k.sh"
    proc = run_script(script, "trainer.test_freq=3", PYTHON=str(fake_python), FAKE_OUT=str(out))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text())
    assert rec["argv"][:2] == ["-m", "rpg.launch"] and rec["argv"][-1] == "trainer.test_freq=3"
    assert rec["argv"][2:] == overrides(script) + ["trainer.test_freq=3"]
    assert rec["plugins"] == "rpg.verl_plugin" and rec["pythonpath"].split(":")[0] == str(REPO)


_FAKE_SDK = """import json, os
class JobSubmissionClient:
    def __init__(self, address):
        self.address = address
    def submit_job(self, **kw):
        json.dump({"address": self.address, **kw}, open(os.environ["FAKE_OUT"], "w"))
        return kw["submission_id"]
    async def tail_job_logs(self, job_id):
        yield "a line of the job's log\\n"
    def get_job_status(self, job_id):
        return os.environ.get("FAKE_STATUS", "SUCCEEDED")
"""


def _fake_ray(tmp_path: Path, sdk: str = _FAKE_SDK) -> dict:
    """The environment of a shell whose Python imports a stand-in of Ray's job-submission SDK that records the
    submission in $FAKE_OUT (the launcher runs in the test's interpreter)."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("")
    (tmp_path / "ray" / "job_submission.py").write_text(sdk)
    return {"RAY_ADDRESS": "http://head:8265", "FAKE_OUT": str(tmp_path / "out.json"), "PYTHONPATH": str(tmp_path),
            "PYTHON": sys.executable}  # fmt: skip


@pytest.mark.parametrize("status, rc", [("SUCCEEDED", 0), ("FAILED", 1)])
def test_ray_address_submits_a_ray_job(tmp_path: Path, status: str, rc: int):
    env = _fake_ray(tmp_path) | {"FAKE_STATUS": status}
    proc = run_script(RECIPE / "7b" / "run_grpo_7b.sh", "trainer.nnodes=2", **env)
    assert proc.returncode == rc, proc.stderr  # followed by default: the exit status is the job's
    job = json.loads((tmp_path / "out.json").read_text())
    assert job["address"] == "http://head:8265"
    runtime_env = job["runtime_env"]
    assert runtime_env["working_dir"] == str(REPO)
    assert runtime_env["env_vars"]["VERL_USE_EXTERNAL_MODULES"] == "rpg.verl_plugin"
    assert runtime_env["py_modules"] == [str(REPO / "rpg")] and ".venv*" in runtime_env["excludes"]
    entry = shlex.split(job["entrypoint"])
    assert entry[:3] == [sys.executable, "-m", "rpg.launch"] and entry[-1] == "trainer.nnodes=2"
    job_id = job["submission_id"]
    assert job_id.startswith("rpg-run_grpo_7b-")
    assert f"Ray job submission id: {job_id}" in proc.stderr
    assert f"ray job logs --address http://head:8265 --follow {job_id}" in proc.stderr
    assert "a line of the job's log" in proc.stdout and f"Ray job {job_id}: {status}" in proc.stderr


def test_ray_submission_of_a_cpu_recipe_carries_the_cpu_environment(tmp_path: Path):
    env = _fake_ray(tmp_path) | {"RPG_RAY_FOLLOW": "0", "RPG_RAY_JOB_ID": "my-run-1", "CPU_RANKS": "2",
                                 "RPG_JOB_ENV": " MY_CACHE  MY_UNSET_VAR", "MY_CACHE": "/shared/cache dir",
                                 "FAKE_STATUS": "FAILED"}  # fmt: skip
    proc = run_script(RECIPE / "cpu" / "run_rpg_reinforce_urkl.sh", **env)
    assert proc.returncode == 0, proc.stderr  # not followed: returns after the submission
    job = json.loads((tmp_path / "out.json").read_text())
    assert job["submission_id"] == "my-run-1" and "a line of the job's log" not in proc.stdout
    env_vars = job["runtime_env"]["env_vars"]
    assert env_vars["VERL_PLATFORM"] == "cpu" and env_vars["VERL_ENGINE_DEVICE"] == "cuda"
    # TransferQueue's threads follow OpenMP's: its default 8 warns on every put and get of a 2-core machine
    assert env_vars["OMP_NUM_THREADS"] == env_vars["TQ_NUM_THREADS"] == "1"
    assert env_vars["VERL_USE_EXTERNAL_MODULES"] == "rpg.cpu.platform,rpg.cpu.hf_rollout,rpg.verl_plugin"
    assert env_vars["MY_CACHE"] == "/shared/cache dir" and "MY_UNSET_VAR" not in env_vars  # the user's RPG_JOB_ENV
    argv = shlex.split(job["entrypoint"])
    assert "trainer.n_gpus_per_node=2" in argv and not [a for a in argv if "ray_init.num_" in a]


def test_ray_address_without_the_ray_sdk_is_refused(tmp_path: Path):
    env = _fake_ray(tmp_path, sdk="raise ImportError('No module named ray.job_submission')\n")
    proc = run_script(RECIPE / "7b" / "run_grpo_7b.sh", **env)
    assert proc.returncode == 2 and "`ray` cannot be imported" in proc.stderr, proc.stderr
    assert "RAY_ADDRESS='http://head:8265'" in proc.stderr and "activate the environment" in proc.stderr


def test_bad_job_env_name_is_refused(tmp_path: Path):
    env = _fake_ray(tmp_path) | {"RPG_JOB_ENV": "HF_HOME WANDB-KEY"}
    proc = run_script(RECIPE / "7b" / "run_grpo_7b.sh", **env)
    assert proc.returncode == 2 and "'WANDB-KEY' is not an environment variable name" in proc.stderr, proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_bad_ray_follow_setting_is_refused(tmp_path: Path):
    env = _fake_ray(tmp_path) | {"RPG_RAY_FOLLOW": "yes"}
    proc = run_script(RECIPE / "7b" / "run_grpo_7b.sh", **env)
    assert proc.returncode == 2 and "RPG_RAY_FOLLOW='yes' is not valid; choose one of: 0 1" in proc.stderr
    assert not (tmp_path / "out.json").exists()


# --------------------------------------------------------------------------------------------------------------
# End to end: the shell script starts `python -m rpg.launch` with RPG_DRY_RUN=1 (no Ray)
# --------------------------------------------------------------------------------------------------------------
def test_real_dry_run_prints_resolved_yaml(tmp_path: Path):
    script = RECIPE / "4b" / "run_rpg_reinforce_ufkl_4k_beta1e-3_noiterref.sh"  # RPG loss + a reference model
    import subprocess

    from recipe_helpers import clean_env

    proc = subprocess.run(["bash", str(script)], env=clean_env(RPG_DRY_RUN="1", PYTHON=sys.executable), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load(proc.stdout)  # stdout is exactly the resolved config
    expected = validated(script).config.actor_rollout_ref.actor.policy_loss
    for key in ("_target_", "loss_mode", "kl_coef", "reference"):
        assert cfg["actor_rollout_ref"]["actor"]["policy_loss"].get(key) == expected.get(key)
    assert cfg["trainer"]["experiment_name"] == script.stem
    assert cfg["actor_rollout_ref"]["rollout"]["n"] == 16
    assert list(tmp_path.iterdir()) == []  # a dry run leaves nothing behind (no Hydra outputs/ dir)
    assert "[rpg] chat template: thinking off" in proc.stderr, proc.stderr[-3000:]  # which template applies


def test_dry_run_rejects_bad_override(monkeypatch, capsys, tmp_path: Path):
    """`RPG_DRY_RUN=1 bash run_rpg_urkl_2k.sh <bad override>` in-process through `rpg.launch.main` (Hydra's entry, as
    the shell runs it, with the script's argv; the shell path itself runs in the real dry run above): refused with a
    non-zero exit status, nothing on stdout."""
    from rpg import launch

    monkeypatch.setattr(sys, "argv", ["rpg.launch"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RPG_DRY_RUN", "1")
    for name in ("RAY_ADDRESS", "SMOKE"):
        monkeypatch.delenv(name, raising=False)
    script = RECIPE / "4b" / "run_rpg_urkl_2k.sh"
    args = ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001"]
    with pytest.raises(SystemExit) as info:
        launch.main(overrides(script) + args)
    out, err = capsys.readouterr()
    code = info.value.code  # a message: the interpreter prints it to stderr and exits with status 1
    assert (code if isinstance(code, int) else 1) != 0 and out == ""
    stderr = err + ("" if isinstance(code, int) or code is None else f"{code}\n")
    assert "invalid RPG configuration" in stderr and "use_kl_loss=False" in stderr


def test_the_async_4k_script_is_colocate_async_with_token_tis():
    """run_rpg_reinforce_urkl_4k_async.sh: the sync 4K script's method, verl's colocated asynchronous trainer, π_old
    recomputed (bypass would ignore the TIS weights), token-level TIS truncated at 2.0, FSDP2 (docs/async.md#modes)."""
    cfg = validated(RECIPE / "4b" / "run_rpg_reinforce_urkl_4k_async.sh").config
    sync = validated(RECIPE / "4b" / "run_rpg_reinforce_urkl_4k.sh").config
    assert cfg.trainer.v1.trainer_mode == "colocate_async" and sync.trainer.v1.trainer_mode == "sync"
    corr = cfg.algorithm.rollout_correction
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.bypass_mode) == ("token", 2.0, False)
    assert cfg.actor_rollout_ref.actor.strategy == cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.actor.policy_loss == sync.actor_rollout_ref.actor.policy_loss


# ---- the one-GPU LoRA rows (recipe/rpg/1gpu/; docs/gpu.md#lora, recipe/rpg/README.md#one-gpu) ---------------------
# Each 4B row is its paper row with LoRA on one GPU and nothing else changed: same data, rewards, batch, β and
# evaluation. LoRA Without Regret (Schulman et al., Thinking Machines Lab, 2025): every linear layer, LR 10×.
ONE_GPU_PAIRS = {"run_dapo_2k_lora.sh": "run_dapo_2k.sh", "run_dapo_4k_lora.sh": "run_dapo_4k.sh",
                 "run_rpg_reinforce_urkl_2k_lora.sh": "run_rpg_reinforce_urkl_2k.sh",
                 "run_rpg_reinforce_urkl_4k_lora.sh": "run_rpg_reinforce_urkl_4k.sh"}
LORA_KEYS = {"actor_rollout_ref.model.lora_rank": 32, "actor_rollout_ref.model.lora_alpha": 32,
             "actor_rollout_ref.model.target_modules": "all-linear", "trainer.n_gpus_per_node": 1}


def _flat(node, prefix=""):
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(node, resolve=True) if prefix == "" else node
    out = {}
    for key, value in container.items():
        name = f"{prefix}{key}"
        out.update(_flat(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def test_the_one_gpu_rows_are_the_lora_scripts_of_the_table():
    assert sorted(p.name for p in SCRIPTS_1GPU) == sorted([*ONE_GPU_PAIRS, "run_dapo_qwen3_1_7b_2k_lora.sh",
                                                           "run_rpg_reinforce_urkl_qwen3_1_7b_2k_lora.sh"])


@pytest.mark.parametrize("lora_name, paper_name", sorted(ONE_GPU_PAIRS.items()))
def test_a_one_gpu_row_is_its_paper_row_with_lora_and_nothing_else(lora_name, paper_name):
    lora, paper = _flat(composed(RECIPE / "1gpu" / lora_name)), _flat(composed(RECIPE / "4b" / paper_name))
    changed = {k for k in lora.keys() | paper.keys() if lora.get(k) != paper.get(k)}
    names = {"trainer.experiment_name", "trainer.default_local_dir", "actor_rollout_ref.rollout.trace.experiment_name"}
    one_gpu = {"trainer.n_gpus_per_node", "actor_rollout_ref.rollout.n_gpus_per_node"}  # the rollout's follows
    lora_set = {"actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora_alpha"}  # all-linear: verl's default
    assert changed - names == {*lora_set, *one_gpu, "actor_rollout_ref.actor.optim.lr",
                               "actor_rollout_ref.rollout.gpu_memory_utilization"}
    assert {k: lora[k] for k in LORA_KEYS} == LORA_KEYS
    assert lora["actor_rollout_ref.actor.optim.lr"] == pytest.approx(10 * paper["actor_rollout_ref.actor.optim.lr"])


@pytest.mark.parametrize("script", SCRIPTS_1GPU, ids=lambda p: p.name)
def test_a_one_gpu_row_says_it_is_not_the_paper_and_its_projected_time(script):
    header = script.read_text().replace("\n# ", " ")
    assert "Not the paper's setting" in header and "LoRA Without Regret" in header
    assert re.search(r"Projected (wall time on one GPU|cost): [\d-]+ (hours|GPU-hours)", header)


@pytest.mark.parametrize("script", SCRIPTS_1GPU, ids=lambda p: p.name)
def test_a_one_gpu_dry_run_shows_the_lora_terms(script):
    with dd.fixed_machine():
        text = dd.plan_text(validated(script))
    assert "# lora       rank 32, alpha 32, target_modules all-linear, merge False" in text
    for term in ("frozen base (fp32; no grads, no optimizer states)", "adapter (fp32)", "adapter grads",
                 "adapter optimizer states (2 fp32)", "vLLM LoRA buffers (max_loras 1, max_lora_rank 32"):
        assert f"# lora mem   {term}" in text
