"""The top-k KL's engine hook (`policy_loss.kl_estimator=topk`, docs/losses.md#topk-kl): the support selected in the
log-prob pass that already computes the reference's log-probs, carried in the batch to the update, and the per-token
analytic KL computed there from the current logits.

verl 0.9.1 has a logits hook only for distillation (`distillation_use_topk`, switched on by its trainer for
distillation alone) and no way to return (tokens, k) values from a log-prob pass, so `install()` wraps, after the
version and signature guards (`rpg.compat`):

* ``FSDPEngineWithLMHead.prepare_model_outputs`` (workers/engine/fsdp/transformer_impl.py): when the micro-batch
  carries `SELECT` (k), the k most probable ids of the temperature-scaled logits and their log-probs
  (`rpg.topk_kl.select_support`), as nested (sequence, position, k) int32/fp32 outputs `IDS`, `LOG_PROBS` next to verl's
  ``log_probs`` (so they reach the batch like them: the TransferQueue of the v1 trainer, every data-parallel rank's
  share); when it carries `TRAIN` (direction, tail), the per-token `rpg.topk_kl.topk_kl` of the current logits at the
  batch's support (`KL`, with gradient), 1[y ∈ S] (`IN_SUPPORT`) and the support's moments of the KL share
  (`SHARE`, `rpg.topk_kl.share_moments`), per-token scalars like verl's log-probs;
* ``ActorRolloutRefWorker.compute_log_prob`` / ``compute_ref_log_prob`` / ``update_actor``: they set `SELECT` in the
  pass of the KL's reference (π_old's for the iterative reference, π_ref's for frozen/periodic/EMA and for
  ``grpo_wk3``: the settings' ``needs_ref_log_prob``) and `TRAIN` in the update, from the worker's own policy-loss settings; a pass-through otherwise;
* verl's ``ppo_loss`` (both bindings, as `rpg.reference.adapter`): pads `KL`/`IN_SUPPORT` to the response layout and
  publishes them for the RPG loss of the call (`current`).

Rows are aligned by construction: the support of packed row t is the distribution of the token after position t, the
row of verl's own ``log_probs``; the nested layout keeps it through any re-packing of the micro-batches. Both padding
layouts of verl (``use_remove_padding`` true or false) are covered; Ulysses sequence parallelism, fused kernels and
pad_to_length are refused before launch (`rpg.preflight.topk_rules`). The KL is computed on every packed row (prompt
rows included; masked in the loss). Memory: the temperature-scaled logits are a second (rows, V) tensor when the
temperature is not 1 (verl scales out of place too).
"""

from __future__ import annotations

import contextvars
import sys
from typing import Any, Callable, NamedTuple, Optional

import torch

from rpg.compat import SUPPORTED_VERL, marked_wrapper, require_signature, require_version

__all__ = ["TopKTerms", "check", "current", "install", "installed", "request_for"]

Tensor = torch.Tensor

SELECT, TRAIN = "rpg_topk_select", "rpg_topk_train"  # non-tensor keys of the batch: k; "direction,tail"
IDS, LOG_PROBS = "rpg_topk_ids", "rpg_topk_log_probs"  # batch fields: the support, nested (seq, pos, k)
KL, IN_SUPPORT = "rpg_topk_kl", "rpg_topk_in_support"  # model outputs of the update, per token
SHARE = tuple(f"rpg_topk_share_{name}" for name in ("sum_a", "sum_aa", "sum_ap", "sum_pp", "sum_sq"))  # float64
ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
WORKERS_MODULE = "verl.workers.engine_workers"
LOSSES_MODULE = "verl.workers.utils.losses"
WHAT = "rpg's top-k KL hook on verl's FSDP engine, ActorRolloutRefWorker and ppo_loss (rpg/topk_hook.py)"
MARK = "__rpg_topk_hook__"


class TopKTerms(NamedTuple):
    """The top-k KL of the micro-batch inside ``ppo_loss``, in the response layout (bs, T) of the loss's inputs."""

    kl: Tensor  # analytic part (+ bucket tail), with gradient through the current logits; 0 on padding
    in_support: Tensor  # bool: the sampled token is in the support
    moments: Any = None  # rpg.topk_kl.ShareMoments of the KL share (detached), or None


_CURRENT: contextvars.ContextVar[Optional[TopKTerms]] = contextvars.ContextVar("rpg_topk_terms", default=None)


def current() -> Optional[TopKTerms]:
    """The top-k terms of the micro-batch currently inside verl's ``ppo_loss`` (None outside it or without them)."""
    return _CURRENT.get()


# ---- which pass does what (from the worker's settings) ---------------------------------------------------------------
def request_for(settings: Any, method: str) -> Optional[tuple[str, Any]]:
    """The (key, value) `method` of the worker sets in its batch for `settings` (an RPGPolicyLossConfig), or None:
    `SELECT` = k in the reference's log-prob pass, `TRAIN` = "direction,tail" in the update."""
    if not getattr(settings, "topk", False):
        return None
    reference_model = settings.needs_ref_log_prob  # the KL's reference is π_ref (frozen/periodic/EMA, grpo_wk3)
    if method == "update_actor":
        direction = "reverse" if settings.spec.divergence.reverse else "forward"
        return TRAIN, f"{direction},{settings.kl_topk_tail}"
    if (method == "compute_ref_log_prob") == reference_model:
        return SELECT, int(settings.kl_topk)
    return None


def _settings(worker: Any) -> Any:
    cached = worker.__dict__.get("_rpg_topk_settings", False)
    if cached is not False:
        return cached
    settings = None
    actor = worker.config.get("actor", None) if hasattr(worker.config, "get") else None
    policy_loss = None if actor is None else actor.get("policy_loss", None)
    if policy_loss is not None and policy_loss.get("kl_estimator") is not None:  # set: the typed settings decide
        from rpg.loss_config import rpg_settings

        settings = rpg_settings(actor)
    worker.__dict__["_rpg_topk_settings"] = settings
    return settings


def _mark(data: Any, key: str, value: Any) -> None:
    """Put `key`=`value` in the batch: TransferQueue metadata (v1 trainer: its extra_info becomes the TensorDict's
    non-tensor data on the worker) or a TensorDict."""
    if hasattr(data, "extra_info") and not hasattr(data, "batch_size"):
        if data.extra_info is None:
            data.extra_info = {}
        data.extra_info[key] = value
    else:
        from verl.utils import tensordict_utils as tu

        tu.assign_non_tensor(data, **{key: value})


_hooked = marked_wrapper(MARK)  # idempotent, keeps verl's ``@register`` metadata, carries MARK


def _worker_method(name: str) -> Callable[[Callable], Callable]:
    @_hooked
    def make(orig: Callable) -> Callable:
        def method(self, data, *args, **kwargs):
            request = request_for(_settings(self), name)
            if request is not None:
                _mark(data, *request)
            return orig(self, data, *args, **kwargs)

        return method

    return make


# ---- the engine: selection and the per-token KL ----------------------------------------------------------------------
def _get(micro_batch: Any, key: str, default: Any) -> Any:
    from verl.utils import tensordict_utils as tu

    return tu.get_non_tensor_data(data=micro_batch, key=key, default=default)


def packed_logits(output: Any, output_args: dict, micro_batch: Any) -> tuple[Tensor, Tensor]:
    """(logits (rows, V) scaled by the temperature as verl scales them, next-token labels (rows,)): one row per token
    of the micro-batch's sequences, in the nested layout of ``input_ids`` (verl's packed padding stripped)."""
    from torch.distributed.tensor import DTensor

    from verl.workers.engine.fsdp.transformer_impl import _scale_logits_by_temperature

    unit = output_args.get("temperature_is_one", False)
    if _get(micro_batch, "use_remove_padding", True):
        logits = output.logits.squeeze(0)
        if isinstance(logits, DTensor):
            logits = logits.full_tensor()
        logits = _scale_logits_by_temperature(logits, output_args["temperature_rmpad"].unsqueeze(-1),
                                              is_unit_temperature=unit)  # fmt: skip
        labels, pad = output_args["input_ids_rmpad_rolled"], int(output_args.get("pad_size", 0) or 0)
        if pad:
            logits, labels = logits[:-pad], labels[:-pad]
        return logits, labels
    logits = output.logits
    if isinstance(logits, DTensor):
        logits = logits.full_tensor()
    logits = _scale_logits_by_temperature(logits, output_args["temperature"][:, None, None], is_unit_temperature=unit)
    lengths = micro_batch["input_ids"].offsets().diff().tolist()
    return torch.cat([logits[i, :n] for i, n in enumerate(lengths)]), output_args["input_ids_rmpad_rolled"]


def _nested(values: Tensor, micro_batch: Any) -> Tensor:
    return torch.nested.nested_tensor_from_jagged(values, micro_batch["input_ids"].offsets())


def topk_outputs(output: Any, output_args: dict, micro_batch: Any) -> dict[str, Tensor]:
    """The hook's model outputs for a micro-batch (empty when it carries neither `SELECT` nor `TRAIN`)."""
    from rpg import topk_kl

    k, train = _get(micro_batch, SELECT, None), _get(micro_batch, TRAIN, None)
    if not k and not train:
        return {}
    logits, labels = packed_logits(output, output_args, micro_batch)
    out = {}
    if k:
        support = topk_kl.select_support(logits.detach(), int(k))
        out[IDS] = _nested(support.ids, micro_batch)
        out[LOG_PROBS] = _nested(support.log_probs.float(), micro_batch)
    if train:
        if IDS not in micro_batch.keys() or LOG_PROBS not in micro_batch.keys():
            raise RuntimeError(
                f"the top-k KL update found no support ({IDS}, {LOG_PROBS}) in its batch: the log-prob pass of the "
                "reference did not select it (is rpg's topk_kl hook installed in every worker? RPG_INSTALL must name "
                "topk_kl; rpg/install.py)"
            )
        direction, tail = str(train).split(",")
        ids = micro_batch[IDS].values().to(logits.device)
        support = topk_kl.Support(ids, micro_batch[LOG_PROBS].values().to(logits.device))
        terms = topk_kl.topk_kl(logits, support, direction, tail, with_sum_sq=True)
        out[KL] = _nested(terms.kl.float(), micro_batch)
        out[IN_SUPPORT] = _nested(topk_kl.in_support(ids, labels).float(), micro_batch)
        out.update(zip(SHARE, (_nested(m, micro_batch) for m in topk_kl.share_moments(terms))))
    return out


@_hooked
def _wrap_prepare_model_outputs(orig: Callable) -> Callable:
    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        model_output = orig(self, output, output_args, micro_batch, logits_processor_func)
        model_output.update(topk_outputs(output, output_args, micro_batch))
        return model_output

    return prepare_model_outputs


# ---- ppo_loss: the terms in the loss's layout --------------------------------------------------------------------------
@_hooked
def _wrap_ppo_loss(orig: Callable) -> Callable:
    def ppo_loss(config, model_output, data, dp_group=None):
        if KL not in model_output:
            return orig(config, model_output, data, dp_group=dp_group)
        from verl.workers.utils.padding import no_padding_2_padding

        from rpg.topk_kl import ShareMoments

        pad = lambda key: no_padding_2_padding(model_output[key], data)  # noqa: E731
        moments = ShareMoments(*map(pad, SHARE)) if SHARE[0] in model_output else None
        terms = TopKTerms(pad(KL), pad(IN_SUPPORT) > 0.5, moments)
        token = _CURRENT.set(terms)
        try:
            return orig(config, model_output, data, dp_group=dp_group)
        finally:
            _CURRENT.reset(token)

    return ppo_loss


# ---- install ----------------------------------------------------------------------------------------------------------
WORKER_METHODS = {"compute_log_prob": ("self", "data"), "compute_ref_log_prob": ("self", "data"),
                  "update_actor": ("self", "data")}  # fmt: skip
ENGINE_PARAMS = ("self", "output", "output_args", "micro_batch", "logits_processor_func")
PPO_LOSS_PARAMS = ("config", "model_output", "data", "dp_group")


def _targets() -> list[tuple[Any, str, tuple[str, ...], Callable]]:
    """(owner, attribute, verl's parameters, wrapper factory) of every object the hook wraps (imports verl)."""
    import verl.workers.engine.fsdp.transformer_impl as engine
    import verl.workers.engine_workers as workers
    import verl.workers.utils.losses as losses

    worker = workers.ActorRolloutRefWorker
    return [
        (engine.FSDPEngineWithLMHead, "prepare_model_outputs", ENGINE_PARAMS, _wrap_prepare_model_outputs),
        *((worker, name, params, _worker_method(name)) for name, params in WORKER_METHODS.items()),
        (losses, "ppo_loss", PPO_LOSS_PARAMS, _wrap_ppo_loss),
        (workers, "ppo_loss", PPO_LOSS_PARAMS, _wrap_ppo_loss),
    ]


def _current(owner: Any, name: str) -> Callable:
    return owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)


def installed() -> bool:
    """True when every target carries the hook (imports nothing)."""
    if not all(m in sys.modules for m in (ENGINE_MODULE, WORKERS_MODULE, LOSSES_MODULE)):
        return False
    return all(getattr(_current(owner, name), MARK, False) for owner, name, _, _ in _targets())


def check() -> None:
    """Raise RuntimeError if `install` would wrap an object of an unsupported verl version or signature."""
    todo = [t for t in _targets() if not getattr(_current(t[0], t[1]), MARK, False)]
    if todo:
        require_version("verl", SUPPORTED_VERL, WHAT)
    for owner, name, params, _ in todo:
        require_signature(_current(owner, name), params, WHAT)


def install() -> None:
    """Wrap every target (idempotent), after `check`: nothing is patched if it fails."""
    check()
    for owner, name, _, make in _targets():
        setattr(owner, name, make(_current(owner, name)))
