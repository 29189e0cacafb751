"""What each gloo rank runs in the multi-rank engine tests (`RankPool.run(<function>, ...)`; test helper).

Every scenario builds verl 0.9.1's real `ActorRolloutRefWorker` (FSDP2 actor, and the FSDP2 reference engine when
the role has one) with the tiny random Qwen2 of `tiny_qwen2.py`, in fp32, and feeds each rank its contiguous chunk
of one global batch, as verl's dispatch does. The global batch (`padded_batch`) is built once, identically, from a
seed: left-padded prompts and right-padded responses of very different lengths.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Optional

import torch

import rpg.reference.hooks as reference_hooks
from rpg import install
from rpg.modes import VERIFY_ENV
from rpg.reference.weights import engine_module
from rpg.shards import full_tensor, local_shard

PROMPT_W, RESPONSE_W = 5, 9


# ---------------------------------------------------------------------------------------------------------------------
# batch and config
# ---------------------------------------------------------------------------------------------------------------------
def padded_batch(n: int, seed: int) -> dict[str, torch.Tensor]:
    """n sequences: prompts of 1..PROMPT_W tokens (left-padded), responses of 1..RESPONSE_W tokens (right-padded),
    advantages of both signs (one per sequence). Token ids in [3, 48) (vocabulary of the tiny model)."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(1, PROMPT_W + 1, (n,), generator=g)
    r_len = torch.randint(1, RESPONSE_W + 1, (n,), generator=g)
    prompts = torch.randint(3, 48, (n, PROMPT_W), generator=g)
    responses = torch.randint(3, 48, (n, RESPONSE_W), generator=g)
    p_mask = (torch.arange(PROMPT_W)[None, :] >= PROMPT_W - p_len[:, None]).long()
    r_mask = (torch.arange(RESPONSE_W)[None, :] < r_len[:, None]).long()
    prompts, responses = prompts * p_mask, responses * r_mask
    attention_mask = torch.cat([p_mask, r_mask], 1)
    adv = torch.randn(n, 1, generator=g).expand(n, RESPONSE_W) * r_mask
    return {
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "prompts": prompts,
        "responses": responses,
        "response_mask": r_mask,
        "advantages": adv.contiguous(),
    }


def rank_rows(n: int, rank: int, world_size: int) -> slice:
    """The rows of an n-row batch that verl's dispatch gives to `rank` (contiguous equal chunks)."""
    per = n // world_size
    return slice(rank * per, (rank + 1) * per)


def to_td(tensors: dict[str, torch.Tensor], **non_tensor: Any):
    """verl's actor input: the no-padding TensorDict (`left_right_2_no_padding`) plus non-tensor settings."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    n = len(tensors["input_ids"])
    td = left_right_2_no_padding(TensorDict({k: v.clone() for k, v in tensors.items()}, batch_size=[n]))
    tu.assign_non_tensor(td, temperature=1.0, calculate_entropy=False, compute_loss=False, **non_tensor)
    return td


def chunk(tensors: dict[str, torch.Tensor], rank: int, world_size: int) -> dict[str, torch.Tensor]:
    rows = rank_rows(len(tensors["input_ids"]), rank, world_size)
    return {k: v[rows] for k, v in tensors.items()}


def compose(model_dir: str, overrides: list[str]):
    """verl's `ppo_trainer` config for an in-process CPU worker on the tiny model (cpu_worker.py's CPU base: fp32,
    FSDP2, eager attention), the rollout side `hf`, no warm-up, fixed micro-batches, then `overrides`."""
    import cpu_worker

    base = [
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.use_dynamic_bsz=False",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    ]
    return cpu_worker.compose(model_dir, base + list(overrides))


def local_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's own shards of every parameter/buffer (FSDP2 DTensor → its local tensor), copied."""
    return {k: local_shard(v).detach().clone() for k, v in module.state_dict().items()}


def full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter/buffer gathered in full (collective: all ranks must call)."""
    return {k: full_tensor(v).detach().clone() for k, v in module.state_dict().items()}


def equal_states(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest |a − b| over the tensors of `a` that `b` has too (in float32)."""
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a if k in b)


def for_update(td, mini_batch_size: int) -> None:
    """The non-tensor settings verl's trainer gives `update_actor`: one epoch of `mini_batch_size`-sequence
    optimizer steps over the batch in its order (no shuffle), seed 0."""
    from verl.utils import tensordict_utils as tu

    tu.assign_non_tensor(td, compute_loss=True, global_batch_size=mini_batch_size, mini_batch_size=mini_batch_size,
                         epochs=1, seed=0, dataloader_kwargs={"shuffle": False})


def _metrics(out) -> dict[str, list]:
    from verl.utils import tensordict_utils as tu

    return {k: v if isinstance(v, list) else [v] for k, v in tu.get(out, "metrics").items()}


def _log_probs(worker, td, ref: bool) -> torch.Tensor:
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    out = worker.compute_ref_log_prob(td.clone()) if ref else worker.compute_log_prob(td.clone())
    return no_padding_2_padding(tu.get(out, "log_probs"), td).detach()


# ---------------------------------------------------------------------------------------------------------------------
# 1. aggregation: the gradient of the first update on R ranks × M micro-batches
# ---------------------------------------------------------------------------------------------------------------------
def first_update_gradient(
    rank: int, world_size: int, model_dir: str, batch: dict[str, torch.Tensor], loss_mode: str, agg: str, micro: int,
    kl_coef: float,
) -> dict[str, Any]:
    """One `update_actor` (one mini-batch = the whole batch) through verl's TrainingWorker/FSDP2 engine.

    Returns, on every rank, the number of loss calls (micro-batches) and the `global_batch_info` the loss saw; on
    rank 0 also the full gradient (gathered DTensor grads, before clipping) at the engine's first optimizer step.
    """
    from verl.workers.engine_workers import ActorRolloutRefWorker

    n = len(batch["input_ids"])
    config = compose(model_dir, [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={n}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"trainer.n_gpus_per_node={world_size}",
        f"actor_rollout_ref.actor.loss_agg_mode={agg}",
        "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
        f"+actor_rollout_ref.actor.policy_loss.kl_coef={kl_coef}",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=3.0",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.optim.lr=1e-3",
    ])
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    engine = worker.actor.engine

    seen: list[dict] = []
    loss_fn = worker.actor.loss_fn  # functools.partial(ppo_loss, config=<the actor config>)

    def counting_loss(*args, **kwargs):
        result = loss_fn(*args, **kwargs)
        seen.append(dict(loss_fn.keywords["config"].global_batch_info))  # as ppo_loss filled it for this call
        return result

    worker.actor.set_loss_fn(counting_loss)
    grads: dict[str, torch.Tensor] = {}
    step = engine.optimizer_step

    @functools.wraps(step)
    def capture_then_step(*args, **kwargs):
        if not grads:
            for name, p in engine.module.named_parameters():
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                grads[name] = g.detach().clone()
        return step(*args, **kwargs)

    engine.optimizer_step = capture_then_step
    td = to_td(chunk(batch, rank, world_size))
    for_update(td, n)
    worker.update_actor(td)
    return {"loss_calls": len(seen), "global_batch_info": seen, "grads": grads if rank == 0 else None}


# ---------------------------------------------------------------------------------------------------------------------
# 2. periodic reference: refresh (K / κ), the KL all-reduce, checkpoint and resume
# ---------------------------------------------------------------------------------------------------------------------
_PERIODIC_BATCH, _PERIODIC_MINI = 8, 4  # global sequences per training step / per optimizer step -> 2 steps per step


def _periodic_worker(
    model_dir: str, world_size: int, refresh_steps: int, refresh_kl: float, reference: Optional[list[str]] = None
):
    """The fused FSDP2 worker of the reference scenarios; `reference`: policy_loss overrides replacing the periodic
    K/κ ones (the EMA reference, the adaptive β)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    periodic = [
        "+actor_rollout_ref.actor.policy_loss.reference=periodic",
        f"+actor_rollout_ref.actor.policy_loss.ref_refresh_steps={refresh_steps}",
        f"+actor_rollout_ref.actor.policy_loss.ref_refresh_kl={refresh_kl}",
        "+actor_rollout_ref.actor.policy_loss.ref_kl_ema=0.0",  # EMA = this step's KL: κ compares the step's KL
    ]
    config = compose(model_dir, [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={_PERIODIC_MINI}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",  # 2 micro-batches per rank per optimizer step
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={_PERIODIC_BATCH // world_size}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={_PERIODIC_BATCH // world_size}",
        f"trainer.n_gpus_per_node={world_size}",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_urkl",
        "+actor_rollout_ref.actor.policy_loss.kl_coef=0.05",
        *(periodic if reference is None else reference),
    ])
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor_rollout_ref")
    worker.init_model()
    return worker


def _periodic_step(worker, step: int, rank: int, world_size: int, reductions: list) -> dict[str, Any]:
    """One training step as verl's trainer runs it: π_old, π_ref, update (2 optimizer steps). Records the local
    (pre-all-reduce) KL sums of this rank and what every rank checks after the step."""
    tensors = chunk(padded_batch(_PERIODIC_BATCH, seed=100 + step), rank, world_size)
    td = to_td(tensors)
    mask = tensors["response_mask"].bool()
    old, ref = _log_probs(worker, td, ref=False), _log_probs(worker, td, ref=True)
    td["old_log_probs"], td["ref_log_prob"] = old * mask, ref * mask
    for_update(td, _PERIODIC_MINI)
    n_before = len(reductions)
    metrics = _metrics(worker.update_actor(td))
    assert len(reductions) == n_before + 1, "update_actor did not all-reduce the KL exactly once"
    local, reduced = reductions[-1]
    actor, reference = engine_module(worker.actor, "actor"), engine_module(worker.ref, "reference")
    result = {
        "step": step,
        "local_kl": local[0] / local[1],
        "local_kl_sum": local[0],
        "local_tokens": local[1],
        "reduced_kl_sum": reduced[0],
        "reduced_tokens": reduced[1],
        **{k.removeprefix("actor/rpg/"): v[0] for k, v in metrics.items() if k.startswith("actor/rpg/ref_")},
    }
    if result["ref_refreshed"]:
        # π_ref ← π_θ on this rank's own shards, and verl's reference forward now gives the actor's log-probs
        result["shards_equal"] = equal_states(local_state(actor), local_state(reference))
        gap = (_log_probs(worker, td, ref=True) - _log_probs(worker, td, ref=False)) * mask
        result["logprob_gap"] = float(gap.abs().max())
    return result


def _record_reductions(reductions: list) -> None:
    """Record every all-reduce of the reference hooks' KL sums (local values, reduced values) in `reductions`."""
    if getattr(reference_hooks.all_reduce_sum, "_recording", False):
        reference_hooks.all_reduce_sum = reference_hooks.all_reduce_sum.__wrapped__
    orig = reference_hooks.all_reduce_sum

    @functools.wraps(orig)
    def recording(values):
        out = orig(values)
        reductions.append((list(values), list(out)))
        return out

    recording._recording = True
    reference_hooks.all_reduce_sum = recording


def periodic_refresh(
    rank: int, world_size: int, model_dir: str, ckpt_dir: str, refresh_steps: int, refresh_kl: float, steps: int,
    save_at: Optional[int] = None,
) -> dict[str, Any]:
    """Train `steps` steps with a periodic reference (K = refresh_steps, κ = refresh_kl); checkpoint at `save_at`,
    then resume from it in a fresh worker and train the remaining steps. Returns what each rank observed."""
    install.install([install.REF_LOG_PROB, install.WORKER_HOOKS])  # what RPG_INSTALL names in a run
    reductions: list = []
    _record_reductions(reductions)
    worker = _periodic_worker(model_dir, world_size, refresh_steps, refresh_kl)
    out: dict[str, Any] = {"steps": [], "resumed_steps": []}
    for step in range(1, steps + 1):
        out["steps"].append(_periodic_step(worker, step, rank, world_size, reductions))
        if step == save_at:
            worker.save_checkpoint(ckpt_dir, global_step=step)
            out["saved_schedule"] = worker._rpg_reference.schedule.state_dict()
            saved_ref = local_state(engine_module(worker.ref, "reference"))
    out["final_schedule"] = worker._rpg_reference.schedule.state_dict()
    final_ref = local_state(engine_module(worker.ref, "reference"))
    if save_at is None:
        return out

    resumed = _periodic_worker(model_dir, world_size, refresh_steps, refresh_kl)
    initial_ref = local_state(engine_module(resumed.ref, "reference"))
    resumed.load_checkpoint(ckpt_dir)
    out["loaded_schedule"] = resumed._rpg_reference.schedule.state_dict()
    out["loaded_ref_equal_saved"] = equal_states(local_state(engine_module(resumed.ref, "reference")), saved_ref)
    out["saved_ref_differs_from_initial"] = not equal_states(saved_ref, initial_ref)
    for step in range(save_at + 1, steps + 1):
        out["resumed_steps"].append(_periodic_step(resumed, step, rank, world_size, reductions))
    out["resumed_final_schedule"] = resumed._rpg_reference.schedule.state_dict()
    resumed_ref = local_state(engine_module(resumed.ref, "reference"))
    out["resumed_ref_max_diff"] = max(float((resumed_ref[k] - final_ref[k]).abs().max()) for k in final_ref)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# 2b. EMA reference and adaptive β: the blend shard by shard, the controller on every rank, checkpoint and resume
# ---------------------------------------------------------------------------------------------------------------------
def _params64(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's own shards of every parameter, in float64."""
    return {k: local_shard(v).detach().double().clone() for k, v in module.named_parameters()}


def _reference_step(worker, step: int, rank: int, world_size: int, decay: Optional[float]) -> dict[str, Any]:
    """One training step (π_old, π_ref, update of 2 optimizer steps); with `decay` τ, the largest gap between the
    reference's shards after the step and the float64 closed form τ·ref_before + (1 − τ)·actor_after."""
    actor, reference = engine_module(worker.actor, "actor"), engine_module(worker.ref, "reference")
    tensors = chunk(padded_batch(_PERIODIC_BATCH, seed=100 + step), rank, world_size)
    td = to_td(tensors)
    mask = tensors["response_mask"].bool()
    td["old_log_probs"] = _log_probs(worker, td, ref=False) * mask
    td["ref_log_prob"] = _log_probs(worker, td, ref=True) * mask
    for_update(td, _PERIODIC_MINI)
    before = _params64(reference)
    state = getattr(worker, "_rpg_reference", None)
    if state is not None and hasattr(state, "last_check"):
        state.last_check = None  # SMOKE=1's in-worker check of this step's blend (rpg/reference/ema.py)
    metrics = _metrics(worker.update_actor(td))
    ours = {k: v for k, v in metrics.items() if k.startswith(("actor/rpg/ref_", "actor/rpg/kl_c"))}
    out = {"step": step, **{k.removeprefix("actor/rpg/"): v[0] for k, v in ours.items()}}
    if decay is not None:
        after, theta = _params64(reference), _params64(actor)
        blend = {k: decay * before[k] + (1 - decay) * theta[k] for k in after}
        out["blend_err"] = max(float((after[k] - blend[k]).abs().max()) for k in after)
        out["moved"] = max(float((after[k] - before[k]).abs().max()) for k in after)
        out["gap_to_actor"] = max(float((after[k] - theta[k]).abs().max()) for k in after)
        out["worker_blend_check"] = worker._rpg_reference.last_check
    return out


def ema_reference(
    rank: int, world_size: int, model_dir: str, ckpt_dir: str, reference: list[str], steps: int,
    decay: Optional[float] = None, save_at: Optional[int] = None,
) -> dict[str, Any]:
    """Train `steps` steps with the policy_loss overrides `reference`; checkpoint at `save_at`, then resume from it in
    a fresh worker and train the remaining steps. Returns per-step metrics and what each rank observed. Each write of
    the reference weights is checked in the worker, as SMOKE=1 does (`rpg.modes.VERIFY_ENV`)."""
    os.environ[VERIFY_ENV] = "1"
    try:
        return _ema_reference(rank, world_size, model_dir, ckpt_dir, reference, steps, decay, save_at)
    finally:
        os.environ.pop(VERIFY_ENV)


def _ema_reference(
    rank: int, world_size: int, model_dir: str, ckpt_dir: str, reference: list[str], steps: int,
    decay: Optional[float], save_at: Optional[int],
) -> dict[str, Any]:
    worker = _periodic_worker(model_dir, world_size, 0, 0.0, reference=reference)
    out: dict[str, Any] = {"steps": [], "resumed_steps": []}
    for step in range(1, steps + 1):
        out["steps"].append(_reference_step(worker, step, rank, world_size, decay))
        if step == save_at:
            worker.save_checkpoint(ckpt_dir, global_step=step)
            saved_ref = local_state(engine_module(worker.ref, "reference"))
            saved_beta = worker._rpg_kl_control.controller.state_dict() if worker._rpg_kl_control else None
    out["final_ref"] = local_state(engine_module(worker.ref, "reference"))
    if save_at is None:
        return out
    resumed = _periodic_worker(model_dir, world_size, 0, 0.0, reference=reference)
    initial_ref = local_state(engine_module(resumed.ref, "reference"))
    resumed.load_checkpoint(ckpt_dir)
    out["loaded_ref_equal_saved"] = equal_states(local_state(engine_module(resumed.ref, "reference")), saved_ref)
    out["saved_ref_differs_from_initial"] = not equal_states(saved_ref, initial_ref)
    control = resumed._rpg_kl_control
    out["loaded_beta_equal_saved"] = (control.controller.state_dict() if control else None) == saved_beta
    for step in range(save_at + 1, steps + 1):
        out["resumed_steps"].append(_reference_step(resumed, step, rank, world_size, decay))
    resumed_ref = local_state(engine_module(resumed.ref, "reference"))
    out["resumed_ref_max_diff"] = max(float((resumed_ref[k] - out["final_ref"][k]).abs().max()) for k in resumed_ref)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# 3. schedule-free AdamW: y/x switch per rank, checkpoint (training state at y, HF export at x), resume
# ---------------------------------------------------------------------------------------------------------------------
_SF_BATCH, _SF_MINI = 8, 4


def _sf_worker(model_dir: str, world_size: int):
    import rpg.schedule_free_worker as sfw  # imports verl and Ray: in the rank processes only

    config = compose(model_dir, [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={_SF_MINI}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={_SF_BATCH // world_size}",
        f"trainer.n_gpus_per_node={world_size}",
        "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=rpg_reinforce_urkl",
        "+actor_rollout_ref.actor.policy_loss.kl_coef=0.05",
        "actor_rollout_ref.actor.optim.optimizer_impl=schedulefree",
        "actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFree",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.optim.weight_decay=0.1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ])
    worker = sfw.ScheduleFreeActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    return worker


def _sf_step(worker, step: int, rank: int, world_size: int) -> dict[str, list]:

    tensors = chunk(padded_batch(_SF_BATCH, seed=200 + step), rank, world_size)
    td = to_td(tensors)
    td["old_log_probs"] = _log_probs(worker, td, ref=False) * tensors["response_mask"]
    for_update(td, _SF_MINI)
    return _metrics(worker.update_actor(td))


def _optimizer_state(optimizer) -> dict[str, torch.Tensor]:
    flat = {}
    for i, (p, state) in enumerate(optimizer.state.items()):
        for key, value in state.items():
            if torch.is_tensor(value):
                flat[f"{i}.{key}"] = local_shard(value).detach().clone()
    return flat


def schedule_free(rank: int, world_size: int, model_dir: str, ckpt_dir: str) -> dict[str, Any]:
    """2 steps (4 optimizer steps) of schedule-free AdamW on 2 ranks; x/y switch; checkpoint at y with the HF export
    at x; resume in a fresh worker; one more step in both. Returns what each rank observed."""
    from safetensors.torch import load_file

    import rpg.schedule_free as sfm  # imports verl and Ray: in the rank processes only

    worker = _sf_worker(model_dir, world_size)
    module, optimizer = worker.actor.engine.module, worker.actor.engine.optimizer
    out: dict[str, Any] = {}
    first = [_sf_step(worker, s, rank, world_size) for s in (1, 2)]
    out["first_ratio"] = [(m["actor/rpg/ratio_min"][0], m["actor/rpg/ratio_max"][0]) for m in first]
    y, y_full = local_state(module), full_state(module)
    z = {p: optimizer.state[p]["z"] for group in optimizer.param_groups for p in group["params"]}
    beta1 = optimizer.param_groups[0]["betas"][0]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    expected_x = {id(p): torch.lerp(local_shard(p).detach(), local_shard(z[p]), 1 - 1 / beta1) for p in params}
    out["average_changed"] = worker.set_schedule_free_weights(sfm.AVERAGE)
    x_err = max(float((local_shard(p).detach() - expected_x[id(p)]).abs().max()) for p in params)
    out["x_matches_schedulefree_formula"] = x_err
    x_local = local_state(module)
    out["x_differs_from_y"] = not equal_states(x_local, y)
    x_full = full_state(module)
    out["iterate_changed"] = worker.set_schedule_free_weights(sfm.ITERATE)
    out["y_restored_exactly"] = equal_states(local_state(module), y)

    worker.save_checkpoint(ckpt_dir, global_step=2)
    out["ckpt_is_y"] = equal_states(local_state(module), y)
    if rank == 0:
        hf = load_file(os.path.join(ckpt_dir, "huggingface", "model.safetensors"))
        out["hf_export_max_diff_to_x"] = max_diff(hf, x_full)
        out["hf_export_max_diff_to_y"] = max_diff(hf, y_full)
    saved_opt = _optimizer_state(optimizer)

    resumed = _sf_worker(model_dir, world_size)
    resumed.load_checkpoint(ckpt_dir)
    out["resumed_params_equal"] = equal_states(local_state(resumed.actor.engine.module), y)
    out["resumed_optimizer_equal"] = equal_states(_optimizer_state(resumed.actor.engine.optimizer), saved_opt)
    out["resumed_mode"] = resumed._schedule_free.current
    _sf_step(worker, 3, rank, world_size)
    _sf_step(resumed, 3, rank, world_size)
    out["step3_equal"] = equal_states(local_state(resumed.actor.engine.module), local_state(module))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# 2c. LoRA: the periodic reference as a snapshot of the policy's adapter (rpg/reference/lora.py)
# ---------------------------------------------------------------------------------------------------------------------
LORA_RANK, LORA_ALPHA = 4, 8
LORA_KL_TARGET, LORA_KL_HORIZON = 1e-5, 2.0  # the adaptive β beside the LoRA reference


def _lora_worker(model_dir: str, world_size: int, refresh_steps: int, topk: bool = False):
    """verl's fused worker of a LoRA run (role actor_rollout: no reference engine, verl's ``ref_in_actor``) with the
    periodic reference, K = `refresh_steps`, and the adaptive β; `topk`: the top-k KL estimator (k = 4)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    pl = "actor_rollout_ref.actor.policy_loss."
    config = compose(model_dir, [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={_PERIODIC_MINI}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={_PERIODIC_BATCH // world_size}",
        f"trainer.n_gpus_per_node={world_size}",
        "actor_rollout_ref.actor.optim.lr=5e-2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        f"actor_rollout_ref.model.lora_rank={LORA_RANK}",
        f"actor_rollout_ref.model.lora_alpha={LORA_ALPHA}",
        "actor_rollout_ref.model.target_modules=all-linear",
        f"{pl}_target_=rpg.RPGPolicyLossConfig",
        f"{pl}loss_mode=rpg_reinforce_urkl",
        f"+{pl}kl_coef=0.05",
        f"+{pl}reference=periodic",
        f"+{pl}ref_refresh_steps={refresh_steps}",
        *([f"+{pl}kl_estimator=topk", f"+{pl}kl_topk=4", f"+{pl}branch_on=advantage"] if topk else []),
        f"+{pl}kl_control=adaptive", f"+{pl}kl_target={LORA_KL_TARGET}", f"+{pl}kl_horizon={LORA_KL_HORIZON}",
    ])
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    return worker


def _adapter_local(worker) -> dict[str, torch.Tensor]:
    from rpg.reference.lora import adapter_parameters

    module = engine_module(worker.actor, "actor")
    return {k: local_shard(v).detach().clone() for k, v in adapter_parameters(module).items()}


def _snapshot_local(worker) -> dict[str, torch.Tensor]:
    return {k: local_shard(v).detach().clone() for k, v in worker._rpg_reference.snapshot.tensors.items()}


def _lora_pass(worker, td, reference: bool, select: int = 0):
    """verl's log-prob pass as its trainer calls it in a LoRA run: the reference's with ``no_lora_adapter=True``;
    `select`: ask the top-k hook for a support of that size in this pass (as it asks in the reference's)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    from rpg import topk_hook

    data = td.clone()
    tu.assign_non_tensor(data, compute_loss=False)  # a log-prob pass, also after `for_update` marked `td`
    if reference:
        tu.assign_non_tensor(data, no_lora_adapter=True)
    if select:
        tu.assign_non_tensor(data, **{topk_hook.SELECT: select})
    out = worker.compute_log_prob(data)
    return no_padding_2_padding(tu.get(out, "log_probs"), td).detach(), out


def _lora_step(worker, step: int, rank: int, world_size: int, topk: bool) -> dict[str, Any]:
    """One training step of a LoRA run (π_old, the reference pass, update); what this rank checks around it."""
    from rpg import topk_hook

    tensors = chunk(padded_batch(_PERIODIC_BATCH, seed=100 + step), rank, world_size)
    td = to_td(tensors)
    mask = tensors["response_mask"].bool()
    policy = _adapter_local(worker)
    old, old_out = _lora_pass(worker, td, reference=False)
    ref, ref_out = _lora_pass(worker, td, reference=True)
    result: dict[str, Any] = {"step": step, "policy_kept": equal_states(_adapter_local(worker), policy)}
    result["ref_old_gap"] = float(((ref - old) * mask).abs().max())
    if topk:  # the support is selected in the reference's pass only, from the reference's logits
        result["support_in_ref_pass"] = topk_hook.IDS in ref_out.keys() and topk_hook.IDS not in old_out.keys()
        _, policy_out = _lora_pass(worker, td, reference=False, select=4)  # the policy's own support, for contrast
        lps = topk_hook.LOG_PROBS
        result["support_gap_to_policy"] = float((ref_out[lps].values() - policy_out[lps].values()).abs().max())
        td[topk_hook.IDS], td[topk_hook.LOG_PROBS] = ref_out[topk_hook.IDS], ref_out[topk_hook.LOG_PROBS]
    td["old_log_probs"], td["ref_log_prob"] = old * mask, ref * mask
    for_update(td, _PERIODIC_MINI)
    metrics = _metrics(worker.update_actor(td))
    ours = ("actor/rpg/ref_", "actor/rpg/kl_c")
    result.update({k.removeprefix("actor/rpg/"): v[0] for k, v in metrics.items() if k.startswith(ours)})
    if topk:
        result["topk_kl"] = metrics["actor/rpg/topk_kl"][0]
    if result["ref_refreshed"]:
        result["snapshot_equal_adapter"] = equal_states(_snapshot_local(worker), _adapter_local(worker))
        after, after_out = _lora_pass(worker, td, reference=True)
        now, now_out = _lora_pass(worker, td, reference=False, select=4 if topk else 0)
        result["logprob_gap"] = float(((after - now) * mask).abs().max())
        if topk:  # the reference pass's support = the one the policy's own logits give (snapshot = policy now)
            ids, lps = (topk_hook.IDS, topk_hook.LOG_PROBS)
            result["support_equal_policy"] = bool(after_out[ids].values().equal(now_out[ids].values()))
            result["support_gap"] = float((after_out[lps].values() - now_out[lps].values()).abs().max())

    return result


def lora_periodic(
    rank: int, world_size: int, model_dir: str, ckpt_dir: str, refresh_steps: int, steps: int, save_at: int,
    topk: bool = False,
) -> dict[str, Any]:
    """Train `steps` steps of a LoRA run with the periodic reference (K = refresh_steps), checking each rank's snapshot
    against its adapter shards; checkpoint at `save_at`, resume in a fresh worker, train the rest. Also: the rollout's
    weight sync (verl's ``get_per_tensor_param``, lora.merge=False) after a reference pass reads the policy's
    adapter."""
    install.install([install.REF_LOG_PROB, install.WORKER_HOOKS] + ([install.TOPK_KL] if topk else []))
    os.environ[VERIFY_ENV] = "1"
    try:
        worker = _lora_worker(model_dir, world_size, refresh_steps, topk)
        out: dict[str, Any] = {"steps": [], "resumed_steps": []}
        for step in range(1, steps + 1):
            out["steps"].append(_lora_step(worker, step, rank, world_size, topk))
            if step == save_at:
                worker.save_checkpoint(ckpt_dir, global_step=step)
                saved_snapshot = _snapshot_local(worker)
                out["saved_schedule"] = worker._rpg_reference.schedule.state_dict()
            if step == save_at + 1:  # the snapshot lags the policy by one training step here
                out["sync_reads_policy"] = _sync_reads_policy(worker, rank, world_size)
                out["merged_sync_gaps"] = _merged_sync_gaps(worker, rank, world_size)
        final_snapshot, final_adapter = _snapshot_local(worker), _adapter_local(worker)
        out["final_schedule"] = worker._rpg_reference.schedule.state_dict()

        resumed = _lora_worker(model_dir, world_size, refresh_steps, topk)
        resumed.load_checkpoint(ckpt_dir)
        out["loaded_schedule"] = resumed._rpg_reference.schedule.state_dict()
        out["loaded_snapshot_equal_saved"] = equal_states(_snapshot_local(resumed), saved_snapshot)
        for step in range(save_at + 1, steps + 1):
            out["resumed_steps"].append(_lora_step(resumed, step, rank, world_size, topk))
        out["resumed_final_schedule"] = resumed._rpg_reference.schedule.state_dict()
        out["resumed_snapshot_diff"] = max_diff(_snapshot_local(resumed), final_snapshot)
        out["resumed_adapter_diff"] = max_diff(_adapter_local(resumed), final_adapter)
        return out
    finally:
        os.environ.pop(VERIFY_ENV)


def _sync_reads_policy(worker, rank: int, world_size: int) -> bool:
    """After a reference pass, verl's weight sync for the rollout (lora.merge=False: the adapter's tensors) reads the
    policy's adapter, not the snapshot (collective: all ranks call)."""
    from rpg.reference.lora import adapter_parameters

    td = to_td(chunk(padded_batch(_PERIODIC_BATCH, seed=7), rank, world_size))
    _lora_pass(worker, td, reference=True)
    module = engine_module(worker.actor, "actor")
    policy = {k: full_tensor(v).detach().clone() for k, v in adapter_parameters(module).items()}
    snapshot = {k: full_tensor(v).detach().clone() for k, v in worker._rpg_reference.snapshot.tensors.items()}
    params, _ = worker.actor.engine.get_per_tensor_param(layered_summon=False, base_sync_done=True)
    synced = {k: full_tensor(v).detach().clone() for k, v in dict(params).items()}
    by_name = {k.replace(".default.", "."): v for k, v in policy.items()}  # peft's adapter name, dropped by the sync
    matched = [(k, v) for k, v in synced.items() if k in by_name]
    assert len(matched) == len(policy), f"adapter tensors missing in the sync's names {sorted(synced)[:4]}"
    same = all(torch.equal(v.float(), by_name[k].float()) for k, v in matched)
    differs = any(not torch.equal(snapshot[k].float(), policy[k].float()) for k in policy)
    return same and differs


def _merged_sync_gaps(worker, rank: int, world_size: int) -> dict[str, float]:
    """lora.merge=True: after a reference pass verl's sync streams W + (α/r)·B·A in bf16; the largest gap of the
    streamed adapted weights to the policy's merge and to the snapshot's (collective: all ranks call)."""
    from rpg.reference.lora import adapter_parameters

    td = to_td(chunk(padded_batch(_PERIODIC_BATCH, seed=7), rank, world_size))
    _lora_pass(worker, td, reference=True)
    engine = worker.actor.engine
    module = engine_module(worker.actor, "actor")
    full = {k: full_tensor(v).detach().float().clone() for k, v in module.state_dict().items()}
    policy = {k: full_tensor(v).detach().float() for k, v in adapter_parameters(module).items()}
    snapshot = {k: full_tensor(v).detach().float() for k, v in worker._rpg_reference.snapshot.tensors.items()}
    engine.model_config.lora["merge"] = True
    try:
        params, _ = engine.get_per_tensor_param(layered_summon=False, base_sync_done=True)
        synced = {k: v.detach().float().clone() for k, v in params}
    finally:
        engine.model_config.lora["merge"] = False
    gaps = {"policy": 0.0, "snapshot": 0.0, "layers": 0}
    for a_name in (k for k in policy if ".lora_A." in k):
        prefix = a_name.split(".lora_A.")[0]  # base_model.model.<layer path>
        b_name = a_name.replace(".lora_A.", ".lora_B.")
        weight = full[prefix + ".base_layer.weight"]
        name = prefix.removeprefix("base_model.model.") + ".weight"
        for what, adapter in (("policy", policy), ("snapshot", snapshot)):
            merged = (weight + (LORA_ALPHA / LORA_RANK) * adapter[b_name] @ adapter[a_name]).to(torch.bfloat16)
            gaps[what] = max(gaps[what], float((synced[name] - merged.float()).abs().max()))
        gaps["layers"] += 1
    return gaps
