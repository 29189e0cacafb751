"""verl plugin entry point: registers every RPG policy loss and advantage estimator in verl's own registries, then
installs what the run's environment names (`rpg.install`).

verl 0.9.1 imports this module on `import verl` in every process (driver, TaskRunner, workers) through the
`[project.entry-points."verl.plugins"] rpg = "rpg.verl_plugin"` entry point. It does two things:

1. registers names (every process, always; no verl function or class is wrapped for that);
2. calls `rpg.install.install_from_environ()`: installs exactly what the environment variable `RPG_INSTALL` names
   (the ref_log_prob adapter, the periodic-reference hooks, the schedule-free trainer). The launcher puts that variable
   in every Ray process's environment for a run that selects those modes; unset, nothing is installed, so a verl run
   that selects no RPG feature runs verl's own code.

verl swallows plugin import errors at DEBUG level: an installation error is printed to stderr before it propagates
(the RPG loss then names what is missing at its first call). `tests/test_registration_on_cpu.py` checks that a plain
`import verl` registers every name and patches nothing; tests/test_scoped_patches_on_cpu.py that `RPG_INSTALL` installs
exactly what it names. Registration and installation are idempotent.

Registered: every row of the loss table `rpg.loss_table.LOSSES` (`python -m rpg.launch --list`) as a policy loss, and
the advantage estimators `rpg`, `rpg_batchmean`.
"""

from __future__ import annotations

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, register_adv_est, register_policy_loss

from rpg import install
from rpg.advantages import ADVANTAGE_ESTIMATORS
from rpg.kl_addon import make_addon_loss
from rpg.loss_table import ADDON, LOSSES
from rpg.losses import make_policy_loss


def register() -> list[str]:
    """Register (once per process) and return the names registered by RPG."""
    names = []
    for name, spec in LOSSES.items():
        if name not in POLICY_LOSS_REGISTRY or getattr(POLICY_LOSS_REGISTRY[name], "_rpg", False) is False:
            fn = make_addon_loss(spec) if spec.family == ADDON else make_policy_loss(spec)
            fn._rpg = True
            register_policy_loss(name)(fn)
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
    import sys

    print(f"[rpg] error: rpg.verl_plugin could not install {install.ENV}: {_error}", file=sys.stderr)
    raise
