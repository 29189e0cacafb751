"""The dry run's last lines (`RPG_DRY_RUN=1`): what the run would be, in a dozen lines a person reads after the YAML.

Written as YAML comments (`# ...`), so the dry run's output stays one YAML document (`yaml.safe_load` reads it) and
`| tail -15` shows the summary: model, loss, β, reference, clip, context, batch × n, steps, memory plan, prompt
lengths and what a launch would refuse.
"""

from __future__ import annotations

from typing import Optional, Sequence

from omegaconf import DictConfig

from rpg import modes
from rpg.loss_table import loss_spec
from rpg.preflight.gpu import is_gpu_run, runtime_problems
from rpg.preflight.prompts import unchecked_reason
from rpg.preflight.wandb_check import wandb_problem

HEADER = "# ---- rpg dry run: summary ----"


def _loss(config: DictConfig) -> list[tuple[str, str]]:
    actor = config.actor_rollout_ref.actor
    pl = actor.policy_loss
    spec = loss_spec(str(pl.loss_mode))
    adv = f"advantage {config.algorithm.adv_estimator}"
    if spec is not None:
        ref_row, control_row = modes.selected(pl)
        loss = f"{pl.loss_mode} ({spec.paper_row})"
        if pl.get("base_loss_mode") and spec.name.startswith("rpg_kl_"):
            loss += f" over verl's {pl.base_loss_mode}"
        if pl.get("kl_credit", "token") != "token":
            loss += f", KL credit {pl.kl_credit}"
        kl_coef = pl.get("kl_coef", 1e-4)
        rows = [("loss", f"{loss}, {adv}"), ("beta", modes.describe(control_row, pl, kl_coef)),
                ("reference", modes.describe(ref_row, pl, kl_coef))]
        if (estimator := _estimator(config, spec, ref_row)) is not None:  # the sampled estimator: no line
            rows.append(("KL", estimator))
    else:
        kl = (f"verl's KL loss {actor.kl_loss_type}, coef {actor.kl_loss_coef:g}" if actor.use_kl_loss
              else "no KL loss") + (", KL in reward" if config.algorithm.use_kl_in_reward else "")  # fmt: skip
        rows = [("loss", f"{pl.loss_mode} (verl's), {adv}"), ("beta", kl)]
    clip = f"ε1 {actor.clip_ratio_low:g}, ε2 {actor.clip_ratio_high:g}"
    if "clip_ratio_c" in (spec.clip_fields if spec else ("clip_ratio_c",) if pl.loss_mode == "vanilla" else ()):
        clip += f", dual-clip c {actor.clip_ratio_c:g}"
    return rows + [("clip", clip)]


def _estimator(config: DictConfig, spec, ref_row) -> Optional[str]:
    """The top-k KL's line (its support and its size per step), None for the paper's sampled estimator."""
    from rpg.preflight.memory import TOPK_SUPPORT_BYTES, topk_width

    pl = config.actor_rollout_ref.actor.policy_loss
    k = topk_width(pl)
    if not k:
        return None
    data, n = config.data, config.actor_rollout_ref.rollout.n
    tokens = int(data.train_batch_size) * int(n) * (int(data.max_prompt_length) + int(data.max_response_length))
    gib = TOPK_SUPPORT_BYTES * k * tokens / 2**30
    way = "reverse" if spec.divergence.reverse else "forward"
    source = "π_ref's" if ref_row.reference_model else "π_old's"
    return (f"top-k, k {k} ({source} top-k), {pl.get('kl_topk_tail', 'sampled')} tail, {way} KL; support "
            f"{TOPK_SUPPORT_BYTES * k} B per token: up to {gib:.1f} GiB per step (host, TransferQueue)")


def _plan(config: DictConfig) -> str:
    if not is_gpu_run(config):
        return "CPU run (no GPU plan)"
    from rpg.preflight.memory import budget_from_env, memory_plan

    try:
        plan = memory_plan(config, budget_gib=budget_from_env())
    except ValueError as e:
        return f"not computed: {e}"
    return plan.line().split("): ", 1)[-1] + f" per GPU (budget {plan.budget_gib:.1f} GiB)"


def summary_lines(config: DictConfig, refusals: Sequence[str], smoke: Optional[str] = None) -> list[str]:
    """The summary of a validated config; `refusals`: what a real launch would refuse (missing paths, what this node
    lacks); `smoke`: the smoke run's line, if SMOKE=1."""
    data, rollout, trainer = config.data, config.actor_rollout_ref.rollout, config.trainer
    actor = config.actor_rollout_ref.actor
    steps = trainer.get("total_training_steps")
    steps_text = f"{steps} steps" if steps else f"{trainer.total_epochs} epoch(s) of the training data"
    prompts = unchecked_reason(config)
    rows = [
        ("model", str(config.actor_rollout_ref.model.path)),
        *_loss(config),
        ("context", f"prompt {data.max_prompt_length} + response {data.max_response_length} tokens "
                    f"(truncation {data.get('truncation', 'error')}; prompt lengths "
                    f"{'checked' if prompts is None else 'not checked: ' + prompts})"),
        ("batch", f"{data.train_batch_size} prompts × {rollout.n} responses, mini-batch {actor.ppo_mini_batch_size}, "
                  f"lr {actor.optim.lr:g}"),
        ("steps", f"{steps_text}, validation every {trainer.test_freq}, "
                  + (f"checkpoint every {trainer.save_freq}" if trainer.save_freq > 0 else "no checkpoint")),
        ("nodes", f"{trainer.nnodes} × {trainer.n_gpus_per_node} {'GPU' if is_gpu_run(config) else 'rank'}(s)"),
        ("memory", _plan(config)),
    ]  # fmt: skip
    if smoke:
        rows.append(("smoke", smoke))
    lines = [HEADER, *(f"# {k:10} {v}" for k, v in rows)]
    lines.append("# a launch would refuse:" + ("" if refusals else " nothing"))
    lines += [f"#   - {r}" for r in refusals]
    return lines


def launch_refusals(config: DictConfig, path_problems: Sequence[str], local: bool) -> list[str]:
    """What a real launch of a validated config would still refuse: missing local paths, and (GPU, local launch) what
    this node lacks."""
    problems = list(path_problems)
    if is_gpu_run(config) and local:
        problems += runtime_problems(config)
    return problems + [p for p in [wandb_problem(config)] if p]
