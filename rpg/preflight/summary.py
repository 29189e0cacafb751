"""The dry run's last lines (`RPG_DRY_RUN=1`): what the run would be, in a dozen lines a person reads after the YAML.

Written as YAML comments (`# ...`), so the dry run's output stays one YAML document (`yaml.safe_load` reads it) and
`| tail -15` shows the summary: model, loss, β, reference, clip, context, batch × n, steps, memory plan (with LoRA:
the adapter and each of its memory terms, one line each), prompt lengths and what a launch would refuse.
"""

from __future__ import annotations

from typing import Optional, Sequence

from rpg import modes
from rpg.loss_options import option_defaults
from rpg.loss_table import ADDON
from rpg.preflight.gpu import is_gpu_run, runtime_problems
from rpg.preflight.lora_config import lora_settings
from rpg.preflight.memory import TOPK_SUPPORT_BYTES, MemoryPlan
from rpg.preflight.memory_config import budget_from_env, memory_plan, topk_width
from rpg.preflight.prompts import unchecked_reason
from rpg.preflight.verl_configs import ValidatedConfig
from rpg.preflight.wandb_check import wandb_problem

HEADER = "# ---- rpg dry run: summary ----"


def _rpg_loss(validated: ValidatedConfig, adv: str) -> list[tuple[str, str]]:
    """The loss, β, reference and (top-k) KL lines of an RPG loss, from its typed settings (`validated.rpg`)."""
    settings = validated.rpg
    spec = settings.spec
    ref_row, control_row = modes.selected(settings)
    loss = f"{settings.loss_mode} ({spec.paper_row})"
    if spec.family == ADDON:
        loss += f" over verl's {settings.base_loss_mode}"
    if settings.kl_credit != option_defaults()["kl_credit"]:
        loss += f", KL credit {settings.kl_credit}"
    rows = [("loss", f"{loss}, {adv}"), ("beta", modes.describe(control_row, settings)),
            ("reference", modes.describe(ref_row, settings))]
    if (estimator := _estimator(validated, ref_row)) is not None:  # the sampled estimator: no line
        rows.append(("KL", estimator))
    return rows


def _verl_loss(validated: ValidatedConfig, adv: str) -> list[tuple[str, str]]:
    """The loss and KL lines of verl's own loss (its KL loss, its KL in the reward)."""
    actor = validated.actor
    kl = f"verl's KL loss {actor.kl_loss_type}, coef {actor.kl_loss_coef:g}" if actor.use_kl_loss else "no KL loss"
    kl += ", KL in reward" if validated.algorithm.use_kl_in_reward else ""
    return [("loss", f"{actor.policy_loss.loss_mode} (verl's), {adv}"), ("beta", kl)]


def _loss(validated: ValidatedConfig) -> list[tuple[str, str]]:
    actor = validated.actor
    adv = f"advantage {validated.algorithm.adv_estimator}"
    rows = _rpg_loss(validated, adv) if validated.rpg is not None else _verl_loss(validated, adv)
    spec = validated.rpg.spec if validated.rpg is not None else None
    clip = f"ε1 {actor.clip_ratio_low:g}, ε2 {actor.clip_ratio_high:g}"
    dual_clip = spec.clip_fields if spec else ("clip_ratio_c",) if actor.policy_loss.loss_mode == "vanilla" else ()
    if "clip_ratio_c" in dual_clip:
        clip += f", dual-clip c {actor.clip_ratio_c:g}"
    return rows + [("clip", clip)]


def _estimator(validated: ValidatedConfig, ref_row) -> Optional[str]:
    """The top-k KL's line (its support and its size per step), None for the paper's sampled estimator."""
    settings = validated.rpg
    k = topk_width(settings)
    if not k:
        return None
    data, n = validated.config.data, validated.rollout.n
    tokens = int(data.train_batch_size) * int(n) * (int(data.max_prompt_length) + int(data.max_response_length))
    gib = TOPK_SUPPORT_BYTES * k * tokens / 2**30
    way = "reverse" if settings.spec.divergence.reverse else "forward"
    source = "π_ref's" if ref_row.reference_model else "π_old's"
    return (f"top-k, k {k} ({source} top-k), {settings.kl_topk_tail} tail, {way} KL; support "
            f"{TOPK_SUPPORT_BYTES * k} B per token: up to {gib:.1f} GiB per step (host, TransferQueue)")


def _plan(validated: ValidatedConfig) -> tuple[str, Optional[MemoryPlan]]:
    if not is_gpu_run(validated.config):
        return "CPU run (no GPU plan)", None
    try:
        plan = memory_plan(validated, budget_gib=budget_from_env())
    except ValueError as e:
        return f"not computed: {e}", None
    return plan.line().split("): ", 1)[-1] + f" per GPU (budget {plan.budget_gib:.1f} GiB)", plan


def _reference_under_lora(validated: ValidatedConfig, gib: float) -> str:
    """What the reference costs under LoRA (docs/reference-modes.md#lora): no engine of its own (verl's
    ref_in_actor)."""
    ref_row = modes.selected(validated.rpg)[0] if validated.rpg is not None else None
    if ref_row is not None and ref_row.writes_reference:
        return f"reference adapter snapshot (fp32) {gib:.2f} GiB per GPU (policy_loss.reference={ref_row.name})"
    if ref_row.reference_model if ref_row is not None else validated.ref is not None:
        return "reference: the adapter-free base, no copy (verl's ref_in_actor: the adapter disabled)"
    if ref_row is None:
        return "reference: none (no KL to a reference)"
    return f"reference: none (policy_loss.reference={ref_row.name}: π_old, the policy's own adapter)"


def _lora(validated: ValidatedConfig, plan: Optional[MemoryPlan]) -> list[tuple[str, str]]:
    """The LoRA lines: the adapter, then each of its memory terms (docs/gpu.md#lora); none for full weights."""
    lora = lora_settings(validated.config)
    if not lora.enabled:
        return []
    head = (f"rank {lora.rank}, alpha {lora.alpha:g}, target_modules {lora.target_modules}, "
            f"merge {lora.merge}" + (f", from {lora.adapter_path}" if lora.adapter_path else ""))
    if plan is None or not plan.lora:
        return [("lora", head)]
    base_params = plan.shape.param_count()
    rows = [("lora", f"{head}: {plan.lora_params / 1e6:.1f}M adapter parameters "
                     f"({100 * plan.lora_params / base_params:.2f} % of the base's {base_params / 1e9:.2f}B)")]
    for label, gib in plan.lora.items():
        text = (_reference_under_lora(validated, gib) if label.startswith("reference adapter")
                else f"{label} {gib:.2f} GiB per GPU")
        rows.append(("lora mem", text))
    return rows


def _context(validated: ValidatedConfig) -> str:
    data, prompts = validated.config.data, unchecked_reason(validated.config)
    checked = "checked" if prompts is None else "not checked: " + prompts
    return (f"prompt {data.max_prompt_length} + response {data.max_response_length} tokens (truncation "
            f"{data.truncation}; prompt lengths {checked})")


def _steps(trainer) -> str:
    steps = trainer.total_training_steps
    steps_text = f"{steps} steps" if steps else f"{trainer.total_epochs} epoch(s) of the training data"
    saves = f"checkpoint every {trainer.save_freq}" if trainer.save_freq > 0 else "no checkpoint"
    return f"{steps_text}, validation every {trainer.test_freq}, {saves}"


def summary_lines(validated: ValidatedConfig, refusals: Sequence[str], smoke: Optional[str] = None) -> list[str]:
    """The summary of a validated config; `refusals`: what a real launch would refuse (missing paths, what this node
    lacks); `smoke`: the smoke run's line, if SMOKE=1."""
    config = validated.config
    data, trainer, actor = config.data, config.trainer, config.actor_rollout_ref.actor
    batch = (f"{data.train_batch_size} prompts × {validated.rollout.n} responses, mini-batch "
             f"{actor.ppo_mini_batch_size}, lr {validated.actor.optim.lr:g}")
    ranks = "GPU" if is_gpu_run(config) else "rank"
    memory, plan = _plan(validated)
    rows = [
        ("model", str(config.actor_rollout_ref.model.path)),
        *_loss(validated),
        ("context", _context(validated)),
        ("batch", batch),
        ("steps", _steps(trainer)),
        ("nodes", f"{trainer.nnodes} × {trainer.n_gpus_per_node} {ranks}(s)"),
        ("memory", memory),
        *_lora(validated, plan),
    ]
    if smoke:
        rows.append(("smoke", smoke))
    lines = [HEADER, *(f"# {k:10} {v}" for k, v in rows)]
    lines.append("# a launch would refuse:" + ("" if refusals else " nothing"))
    lines += [f"#   - {r}" for r in refusals]
    return lines


def launch_refusals(validated: ValidatedConfig, local: bool) -> list[str]:
    """What a real launch of a validated config would still refuse: missing local paths (`path_problems`), and (GPU,
    local launch) what this node lacks."""
    config = validated.config
    problems = list(validated.path_problems)
    if is_gpu_run(config) and local:
        problems += runtime_problems(config)
    return problems + [p for p in [wandb_problem(config)] if p]
