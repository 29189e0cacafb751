"""verl plugin entry point: registers every RPG policy loss and advantage estimator in verl's own registries, then
installs what the run's environment names (`rpg.install`).

verl 0.9.1 imports this module on `import verl` in every process (driver, TaskRunner, workers) through the
`[project.entry-points."verl.plugins"] rpg = "rpg.verl_plugin"` entry point. It does two things:

1. registers names (every process, always; no verl function or class is wrapped for that);
2. calls `rpg.install.install_from_environ()`: installs exactly what the environment variable `RPG_INSTALL` names
   (the ref_log_prob adapter, the worker hooks, the schedule-free trainer, the top-k hook, ...: the table of patch
   points `rpg.patches`). The launcher puts that variable in every Ray process's environment for a run that selects
   those modes; unset, nothing is installed, so a verl run that selects no RPG feature runs verl's own code.

It imports light: at module level only verl's registries, the loss table (`rpg.loss_table`), the advantage estimators
(`rpg.advantages`) and `rpg.install`, none of which imports an rpg module that imports verl. That is what makes every
import order work without an import hook: `import verl` may have been started by an rpg module (`import rpg.losses`
first: it imports `rpg.loss_config`, which imports verl), and verl loads this plugin while that module is still
half-initialised; importing it from here would fail, and verl would swallow the ImportError at DEBUG level. So a
policy loss is registered as a `LazyLoss`: its loss-table row, and the function built from it (`rpg.losses.
make_policy_loss`, `rpg.kl_addon.make_addon_loss`) at its first call, when every import has finished. The advantage
estimators are plain functions (their module imports verl only inside them) and are registered as they are.

verl swallows plugin import errors at DEBUG level: an installation error is printed to stderr before it propagates
(the RPG loss then names what is missing at its first call). `tests/test_registration_on_cpu.py` checks that a plain
`import verl` registers every name and patches nothing, and that every import order registers every name;
tests/test_scoped_patches_on_cpu.py that `RPG_INSTALL` installs exactly what it names. Registration and installation
are idempotent.

Registered: every row of the loss table `rpg.loss_table.LOSSES` (`python -m rpg.launch --list`) as a policy loss, and
the advantage estimators `rpg`, `rpg_batchmean`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, register_adv_est, register_policy_loss

from rpg import install
from rpg.advantages import ADVANTAGE_ESTIMATORS
from rpg.loss_table import ADDON, LOSSES, LossSpec


class LazyLoss:
    """verl's `PolicyLossFn` of one loss-table row (`spec`), built at the first call: `rpg.kl_addon.make_addon_loss`
    for an add-on row, else `rpg.losses.make_policy_loss` (both import verl, so not at registration)."""

    _rpg = True  # an RPG registry entry (`register` replaces anything else under an RPG name; a reload keeps it)

    def __init__(self, spec: LossSpec):
        self.spec = spec
        self._fn: Optional[Callable[..., Any]] = None

    @property
    def fn(self) -> Callable[..., Any]:
        """The loss function (built once)."""
        if self._fn is None:
            if self.spec.family == ADDON:  # both modules import verl: at the first call, not at registration
                from rpg.kl_addon import make_addon_loss as make
            else:
                from rpg.losses import make_policy_loss as make
            self._fn = make(self.spec)
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<RPG policy loss {self.spec.name!r} (rpg.verl_plugin.LazyLoss)>"


def register() -> list[str]:
    """Register (once per process) and return the names registered by RPG."""
    names = []
    for name, spec in LOSSES.items():
        if not getattr(POLICY_LOSS_REGISTRY.get(name), "_rpg", False):
            register_policy_loss(name)(LazyLoss(spec))
        names.append(name)
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        if ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            register_adv_est(name)(fn)
        names.append(name)
    return names


REGISTERED = register()
try:
    INSTALLED = install.install_from_environ()
except Exception as _error:  # verl would swallow it at DEBUG level
    print(f"[rpg] error: rpg.verl_plugin could not install {install.ENV}: {_error}", file=sys.stderr)
    raise
