"""What each reference mode of the run-mode table (`rpg.modes`) is under LoRA, and which cannot run with it
(docs/reference-modes.md#lora). Pure Python: the launcher's rules read it before verl is imported.

A LoRA run (`rpg.preflight.lora_config.lora_settings(config).enabled`) has no reference engine: verl computes the
reference "in the actor", calling the actor's ``compute_log_prob`` with ``no_lora_adapter=True`` so that its worker
runs the pass under the engine's ``disable_adapter()`` (``ref_in_actor``; verl/trainer/ppo/v1/trainer_base.py and
verl/workers/engine_workers.py ``infer_batch``). Every reference of the table is then an adapter on the shared base:

* ``iterative``: π_old (no reference pass; as without LoRA);
* ``frozen``: verl's adapter-free base (with ``lora_adapter_path``: the base *without* the loaded adapter);
* ``periodic``: a snapshot of the policy's adapter (its LoRA A/B parameters), taken at the first reference pass and
  re-taken on the paper's K/κ schedule (paper §5, "Iterative reference updates"; `rpg.reference.lora`);
* ``ema``: refused (`EMA_REFUSAL`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rpg import modes

__all__ = ["EMA_REFUSAL", "LORA_REFERENCES", "LoraReference", "lora_reference"]

EMA_REFUSAL = (
    "an EMA reference under LoRA is not an adapter: blending the factors A and B is not the EMA of the weights "
    "(B·A of a blend adds cross terms), and the exact weight EMA needs a full-size ΔW for every adapted layer, which "
    "with LoRA on every linear layer is about the size of the whole model in fp32 (Qwen3-4B: ≈3.63B parameters, "
    "≈14.5 GB), the memory of the full-weight EMA reference. Use reference=ema without LoRA, or reference=periodic "
    "(a snapshot of the adapter) or frozen (the adapter-free base) with LoRA (docs/reference-modes.md#lora)"
)


@dataclass(frozen=True)
class LoraReference:
    """One reference mode under LoRA: what π_ref is, and why it cannot run ("" = it runs)."""

    row: modes.Mode
    reference: str  # what π_ref is under LoRA (the docs' and the dry run's words)
    refusal: str = ""  # why the mode cannot run with LoRA ("": it runs)
    snapshot: bool = False  # π_ref is a snapshot of the policy's adapter kept by rpg (`rpg.reference.lora`)


LORA_REFERENCES: dict[str, LoraReference] = {r.row.name: r for r in (
    LoraReference(modes.REFERENCES["iterative"], "π_old, the policy that sampled the batch (no reference pass)"),
    LoraReference(modes.REFERENCES["frozen"],
                  "the adapter-free base model (verl's; with lora_adapter_path, the base without the loaded adapter)"),
    LoraReference(modes.REFERENCES["periodic"],
                  "a snapshot of the policy's adapter on the shared base, re-taken on the K/κ schedule",
                  snapshot=True),
    LoraReference(modes.REFERENCES["ema"], "none (refused)", refusal=EMA_REFUSAL),
)}


def lora_reference(name: str) -> LoraReference:
    """The LoRA row of ``policy_loss.reference=name`` (ValueError naming the choices)."""
    try:
        return LORA_REFERENCES[name]
    except KeyError:
        raise ValueError(f"policy_loss.reference={name!r}: valid choices are {list(LORA_REFERENCES)}") from None
