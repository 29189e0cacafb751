"""One training step of verl's actor worker as the losses and the worker hooks share it: `TrainingStep`.

The worker hooks (`rpg.reference.hooks`) open one `TrainingStep` around ``ActorRolloutRefWorker.update_actor`` when
the run selects a mode with worker state (the rows of `rpg.modes` with ``worker_state``); inside it

* ``beta`` is the β of this step (the adaptive controller's, `rpg.reference.adaptive_kl`; None: the losses use
  ``kl_coef``); the losses read it with `kl_coef(settings)`;
* ``ref_kl`` sums the importance-weighted k3 estimate of the reverse KL(π_θ‖π_ref) per token
  (`rpg.reference.adapter.token_kl_to_reference`, fed by the ``ppo_loss`` adapter on the device): what the periodic
  reference's κ criterion reads;
* ``loss_kl`` sums the per-token KL the loss regularises, handed over once per loss call by `rpg.losses.policy_loss_fn`
  (`rpg.losses.hand_kl_to_step`, on the device): with ``kl_estimator=sampled`` the loss's own estimate of its
  divergence to the reference (``actor/rpg/kl``, `Divergence.estimate`), with ``kl_estimator=topk`` the top-k KL
  (``actor/rpg/topk_kl``). What the adaptive β reads
  (docs/losses.md#adaptive-beta). For FKL/UFKL it differs from ``ref_kl``.

`sums()` returns the four numbers the hooks all-reduce once per step (one device→host transfer). Outside a step
(`current()` None) nothing is measured and an adaptive β is an error (the loss was called outside verl's actor worker).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Optional

from rpg import modes

__all__ = ["TrainingStep", "add_loss_kl", "current", "kl_coef", "measures_loss_kl", "running"]


class TrainingStep:
    """β and the two KL sums of one training step (module docstring)."""

    def __init__(self, beta: Optional[float] = None, measure_ref_kl: bool = False, measure_loss_kl: bool = False):
        self.beta = beta
        self.measure_ref_kl, self.measure_loss_kl = measure_ref_kl, measure_loss_kl
        self._ref_kl: Any = None  # float64 tensor (Σ KL̂ to the reference, #tokens), on the device: no host sync
        self._loss_kl: Any = None  # float64 tensor (Σ regularised KL, #tokens), on the device

    def add_ref_kl(self, sums: Any) -> None:
        """Add a (Σ KL̂, #tokens) float64 tensor of the reverse KL to the reference (the ppo_loss adapter)."""
        if self.measure_ref_kl:
            self._ref_kl = sums if self._ref_kl is None else self._ref_kl + sums

    def add_loss_kl(self, sums: Any) -> None:
        """Add a (Σ KL, #tokens) float64 tensor of the KL the loss regularises (`rpg.losses.hand_kl_to_step`)."""
        if self.measure_loss_kl:
            self._loss_kl = sums if self._loss_kl is None else self._loss_kl + sums

    def sums(self) -> list[float]:
        """[Σ ref KL, ref tokens, Σ loss KL, loss tokens] of this rank (one device→host transfer)."""
        ref, loss = self._ref_kl, self._loss_kl
        if ref is not None and loss is not None:
            both = ref.repeat(2)  # one tensor, one transfer
            both[2:] = loss
            return [float(x) for x in both.tolist()]
        ref = [0.0, 0.0] if ref is None else [float(x) for x in ref.tolist()]
        return ref + ([0.0, 0.0] if loss is None else [float(x) for x in loss.tolist()])


_CURRENT: contextvars.ContextVar[Optional[TrainingStep]] = contextvars.ContextVar("rpg_training_step", default=None)


def current() -> Optional[TrainingStep]:
    """The training step open in this context (inside verl's ``update_actor`` with a worker-state mode), or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def running(step: TrainingStep) -> Iterator[TrainingStep]:
    """Make `step` the current training step for the duration of the block."""
    token = _CURRENT.set(step)
    try:
        yield step
    finally:
        _CURRENT.reset(token)


def kl_coef(settings: Any) -> float:
    """β for the loss now: ``settings.kl_coef``, or the step's β when its KL control moves β.

    Raises RuntimeError when the control moves β and no training step with a β is open (the loss was called outside
    verl's actor worker ``update_actor``, where the hooks of `rpg.reference.hooks` open it)."""
    if not modes.kl_control(settings.kl_control).moves_beta:
        return settings.kl_coef
    step = current()
    if step is None or step.beta is None:
        raise RuntimeError(
            f"kl_control={settings.kl_control!r}: no adaptive-β controller is active in this process. It is built by "
            "rpg's hooks on verl's ActorRolloutRefWorker.update_actor (rpg/reference/hooks.py); the loss was called "
            "outside it. Use kl_control='fixed' there, or open a step with a β first: "
            "`with rpg.reference.step.running(TrainingStep(beta=...))`."
        )
    return step.beta


def measures_loss_kl() -> bool:
    """Whether a training step is open in this context and measures the KL the loss regularises (the adaptive β)."""
    step = current()
    return step is not None and step.measure_loss_kl


def add_loss_kl(sums: Any) -> None:
    """A (Σ KL, #tokens) float64 tensor of the KL the loss regularises, to the current training step (no-op outside
    one). Called once per loss call, by `rpg.losses.policy_loss_fn`."""
    step = current()
    if step is not None:
        step.add_loss_kl(sums)
