"""verl plugin entry point: registers every RPG policy loss and advantage estimator in verl's own registries.

verl 0.9.1 imports this module on `import verl` in every process (driver, TaskRunner, workers) through the
`[project.entry-points."verl.plugins"] rpg = "rpg.verl_plugin"` entry point. verl swallows plugin import errors at
DEBUG level, so this module is deliberately small; `tests/test_registration_on_cpu.py` checks that a plain
`import verl` registers every name. Registration is idempotent (re-importing re-registers the same objects).

Registered:
    policy losses  rpg_{fkl,rkl,ufkl,urkl}                 RPG-<DIV>, fully differentiable (Algorithm 1)
                   rpg_reinforce_{fkl,rkl,ufkl,urkl}       RPG-REINFORCE-<DIV>, RPG-Style Clip (Algorithm 2)
                   rpg_reinforce_hardclip_{...}            the authors' `rpg_rf_<div>` (truncated IS, SPEC D6)
                   grpo_wk3                                GRPO's KL with the importance weight (SPEC §5.3)
    estimators     rpg, rpg_batchmean
"""

from __future__ import annotations

import importlib
import importlib.util

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, register_adv_est, register_policy_loss

from rpg.advantages import ADVANTAGE_ESTIMATORS
from rpg.losses import loss_table, make_policy_loss


def register() -> list[str]:
    """Register (once per process) and return the names registered by RPG."""
    names = []
    for name, (family, div, needs_ref) in loss_table().items():
        if name not in POLICY_LOSS_REGISTRY or getattr(POLICY_LOSS_REGISTRY[name], "_rpg", False) is False:
            fn = make_policy_loss(name, family, div, requires_reference=needs_ref)
            fn._rpg = True
            register_policy_loss(name)(fn)
        names.append(name)
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        if ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            register_adv_est(name)(fn)
        names.append(name)
    if importlib.util.find_spec("rpg.reference") is not None:  # ref_log_prob adapter for non-iterative references
        importlib.import_module("rpg.reference").install()
    return names


REGISTERED = register()
