"""rpg: KL-regularized policy gradients (RPG, ICLR 2026) as a plugin for verl 0.9.1.

verl loads `rpg.verl_plugin` through the `verl.plugins` entry point on `import verl` in every process, which registers
the RPG policy losses and advantage estimators in verl's own registries and installs what the run's `RPG_INSTALL`
names (`rpg.install`, the one place that changes verl for a run).

`import rpg` imports verl first (last line below). Without it, `import rpg.<module>` before verl would start verl's
plugin loading while that rpg module is half-initialised; verl swallows the resulting ImportError and no RPG name would
be registered in that process (tests/test_registration_on_cpu.py checks every import order).
"""

__version__ = "0.1.0"

__all__ = ["RPGPolicyLossConfig"]


def __getattr__(name):  # lazy: `rpg.RPGPolicyLossConfig` (Hydra `_target_`) without importing verl at `import rpg`
    if name == "RPGPolicyLossConfig":
        from rpg.loss_config import RPGPolicyLossConfig

        return RPGPolicyLossConfig
    raise AttributeError(f"module 'rpg' has no attribute {name!r}")


import verl  # noqa: E402,F401  (see the module docstring: registers the plugin before any rpg submodule runs)
