"""The top-k KL's engine hook (`policy_loss.kl_estimator=topk`, docs/losses.md#topk-kl): the support selected in the
log-prob pass that already computes the reference's log-probs, carried in the batch to the update, and the per-token
analytic KL computed there from the current logits.

verl 0.9.1 has a logits hook only for distillation (`distillation_use_topk`, switched on by its trainer for
distillation alone) and no way to return (tokens, k) values from a log-prob pass, so this module's pieces (`PIECES`)
run in these verl objects, hooked by the table of patch points (`rpg.patches`, with its version and signature guards)
for ``RPG_INSTALL=topk_kl``:

* ``FSDPEngineWithLMHead.prepare_model_outputs`` (workers/engine/fsdp/transformer_impl.py): when the micro-batch
  carries `SELECT` (k), the k most probable ids of the temperature-scaled logits and their log-probs
  (`rpg.topk_kl.select_support`), as nested (sequence, position, k) int32/fp32 outputs `IDS`, `LOG_PROBS` next to verl's
  ``log_probs`` (so they reach the batch like them: the TransferQueue of the v1 trainer, every data-parallel rank's
  share); when it carries `TRAIN` (a `TopKUpdate`: direction and tail as typed fields), the per-token
  `rpg.topk_kl.topk_kl` of the current logits at the batch's support (`KL`, with gradient), 1[y ∈ S] (`IN_SUPPORT`)
  and the support's moments of the KL share (`SHARE`, `rpg.topk_kl.share_moments`), per-token scalars like verl's
  log-probs;
* ``ActorRolloutRefWorker.compute_log_prob`` / ``compute_ref_log_prob`` / ``update_actor``: they set `SELECT` in the
  pass of the KL's reference (π_old's for the iterative reference, π_ref's for frozen/periodic/EMA and for
  ``grpo_wk3``: the settings' ``needs_ref_log_prob``) and `TRAIN` in the update, from the worker's own policy-loss
  settings; a pass-through otherwise. In a LoRA run verl's reference pass is ``compute_log_prob`` with
  ``no_lora_adapter=True`` (`rpg.reference.lora.reference_pass_flag`): that call is the reference's pass here
  (docs/reference-modes.md#lora);
* verl's ``ppo_loss`` (both bindings, as `rpg.reference.adapter`): pads `KL`/`IN_SUPPORT` to the response layout and
  puts them in the call's micro-batch record (`rpg.reference.micro_batch`) for the RPG loss of the call (`current`).

Rows are aligned by construction: the support of packed row t is the distribution of the token after position t, the
row of verl's own ``log_probs``; the nested layout keeps it through any re-packing of the micro-batches. Both padding
layouts of verl (``use_remove_padding`` true or false) are covered; Ulysses sequence parallelism, fused kernels and
pad_to_length are refused before launch (`rpg.preflight.topk_rules`). The KL is computed on every packed row (prompt
rows included; masked in the loss). Memory: the temperature-scaled logits are a second (rows, V) tensor when the
temperature is not 1 (verl scales out of place too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch

from rpg import modes, topk_kl
from rpg.reference.lora import reference_pass_flag
from rpg.reference.micro_batch import current as current_micro_batch

__all__ = ["PIECES", "TopKTerms", "TopKUpdate", "current", "request_for"]

Tensor = torch.Tensor

SELECT, TRAIN = "rpg_topk_select", "rpg_topk_train"  # non-tensor keys of the batch: k (int); a TopKUpdate
IDS, LOG_PROBS = "rpg_topk_ids", "rpg_topk_log_probs"  # batch fields: the support, nested (seq, pos, k)
KL, IN_SUPPORT = "rpg_topk_kl", "rpg_topk_in_support"  # model outputs of the update, per token
SHARE = tuple(f"rpg_topk_share_{name}" for name in ("sum_a", "sum_aa", "sum_ap", "sum_pp", "sum_sq"))  # float64
REFERENCE_PASS = "compute_ref_log_prob"  # the worker method of the reference's pass (the actor's own in a LoRA run)


@dataclass(frozen=True)
class TopKUpdate:
    """What the update asks of the engine (`TRAIN`): the KL's direction and tail (`rpg.topk_kl.topk_kl`)."""

    direction: str  # "reverse" (rkl/urkl) or "forward" (fkl/ufkl)
    tail: str  # policy_loss.kl_topk_tail


class TopKTerms(NamedTuple):
    """The top-k KL of the micro-batch inside ``ppo_loss``, in the response layout (bs, T) of the loss's inputs."""

    kl: Tensor  # analytic part (+ bucket tail), with gradient through the current logits; 0 on padding
    in_support: Tensor  # bool: the sampled token is in the support
    moments: Any = None  # rpg.topk_kl.ShareMoments of the KL share (detached), or None


def current() -> Optional[TopKTerms]:
    """The top-k terms of the micro-batch currently inside verl's ``ppo_loss`` (None outside it or without them)."""
    record = current_micro_batch()
    return None if record is None else record.topk


# ---- which pass does what (from the worker's settings) ---------------------------------------------------------------
def request_for(settings: Any, method: str) -> Optional[tuple[str, Any]]:
    """The (key, value) `method` of the worker sets in its batch for `settings` (an RPGPolicyLossConfig), or None:
    `SELECT` = k in the reference's log-prob pass, `TRAIN` = a `TopKUpdate` in the update."""
    if not getattr(settings, "topk", False):
        return None
    reference_model = settings.needs_ref_log_prob  # the KL's reference is π_ref (frozen/periodic/EMA, grpo_wk3)
    if method == "update_actor":
        direction = "reverse" if settings.spec.divergence.reverse else "forward"
        return TRAIN, TopKUpdate(direction, settings.kl_topk_tail)
    if (method == REFERENCE_PASS) == reference_model:
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
        from rpg.loss_config import rpg_settings  # imports verl: not while verl loads this module (rpg.patches)

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


def pass_of(method: str, data: Any) -> str:
    """The pass a call of the worker's `method` is: verl's reference pass of a LoRA run is a ``compute_log_prob``
    whose batch carries ``no_lora_adapter=True`` (`rpg.reference.lora.reference_pass_flag`)."""
    return REFERENCE_PASS if method == "compute_log_prob" and reference_pass_flag(data) else method


def _requesting(method: str) -> Callable:
    """The piece of the worker's `method`: the batch carries what `request_for` says, then verl's method runs."""

    def piece(call: Callable, self, data, *args, **kwargs):
        request = request_for(_settings(self), pass_of(method, data))
        if request is not None:
            _mark(data, *request)
        return call(self, data, *args, **kwargs)

    piece.__name__ = piece.__qualname__ = method
    return piece


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
        temperature = output_args["temperature_rmpad"].unsqueeze(-1)
        logits = _scale_logits_by_temperature(logits, temperature, is_unit_temperature=unit)
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
        ids = micro_batch[IDS].values().to(logits.device)
        support = topk_kl.Support(ids, micro_batch[LOG_PROBS].values().to(logits.device))
        terms = topk_kl.topk_kl(logits, support, train.direction, train.tail, with_sum_sq=True)
        out[KL] = _nested(terms.kl.float(), micro_batch)
        out[IN_SUPPORT] = _nested(topk_kl.in_support(ids, labels).float(), micro_batch)
        out.update(zip(SHARE, (_nested(m, micro_batch) for m in topk_kl.share_moments(terms))))
    return out


def prepare_model_outputs(call: Callable, self, output, output_args, micro_batch, logits_processor_func):
    """The piece of the engine's ``prepare_model_outputs``: verl's outputs plus `topk_outputs`."""
    model_output = call(self, output, output_args, micro_batch, logits_processor_func)
    model_output.update(topk_outputs(output, output_args, micro_batch))
    return model_output


# ---- ppo_loss: the terms in the loss's layout ------------------------------------------------------------------------
def ppo_loss(call: Callable, config, model_output, data, dp_group=None):
    """The piece of verl's ``ppo_loss``: the micro-batch's top-k terms, padded to the loss's layout, into the call's
    record (`current`); then the rest of the call."""
    if KL in model_output:
        current_micro_batch().topk = _terms(model_output, data)
    return call(config, model_output, data, dp_group=dp_group)


def _terms(model_output: dict, data: Any) -> TopKTerms:
    from verl.workers.utils.padding import no_padding_2_padding  # verl at the first call: importing this imports none

    def pad(key: str) -> Tensor:
        return no_padding_2_padding(model_output[key], data)

    moments = topk_kl.ShareMoments(*map(pad, SHARE)) if SHARE[0] in model_output else None
    return TopKTerms(pad(KL), pad(IN_SUPPORT) > 0.5, moments)


#: the pieces of `rpg.patches` for ``RPG_INSTALL=topk_kl`` (attribute -> piece)
PIECES = {
    "prepare_model_outputs": prepare_model_outputs,
    **{method: _requesting(method) for method in ("compute_log_prob", "compute_ref_log_prob", "update_actor")},
    "ppo_loss": ppo_loss,
}
