"""verl plugin entry point: registers every RPG policy loss and advantage estimator in verl's own registries.

verl 0.9.1 imports this module on `import verl` in every process (driver, TaskRunner, workers) through the
`[project.entry-points."verl.plugins"] rpg = "rpg.verl_plugin"` entry point. Registering names is all it does: no verl
function or class is wrapped here, so a verl run that selects no RPG feature runs verl's own code. Importing
`rpg.reference` registers its installer with `rpg.loss_config.on_build`: the adapter a reference mode needs is installed
only when a run's `RPGPolicyLossConfig` is built and asks for it (`rpg.reference`).

verl swallows plugin import errors at DEBUG level, so this module is deliberately small;
`tests/test_registration_on_cpu.py` checks that a plain `import verl` registers every name and patches nothing.
Registration is idempotent (re-importing re-registers the same objects).

Registered: every row of the loss table `rpg.loss_table.LOSSES` (`python -m rpg.launch --list`) as a policy loss, and
the advantage estimators `rpg`, `rpg_batchmean`.
"""

from __future__ import annotations

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, register_adv_est, register_policy_loss

import rpg.reference  # noqa: F401  (registers the reference installer with rpg.loss_config.on_build in every verl process)
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
