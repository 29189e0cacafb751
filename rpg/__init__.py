"""rpg: KL-regularized policy gradients (RPG, ICLR 2026) as a plugin for verl 0.9.1.

verl loads `rpg.verl_plugin` through the `verl.plugins` entry point on `import verl` in every process, which registers
the RPG policy losses and advantage estimators in verl's own registries and installs what the run's `RPG_INSTALL`
names (`rpg.install`, the one place that changes verl for a run). The plugin imports no rpg module that imports verl,
so rpg and verl may be imported in any order (tests/test_registration_on_cpu.py).

`import rpg` does not import verl (about 6 s), nor does the launcher's early path (`rpg.launch` up to its early checks,
`rpg.preflight.early`, `rpg.loss_options`, `rpg.loss_table`): a misspelt loss or option is refused before verl is
imported.
"""

__version__ = "0.1.0"

__all__ = ["RPGPolicyLossConfig"]


def __getattr__(name):  # lazy: `rpg.RPGPolicyLossConfig` (Hydra `_target_`) without importing verl at `import rpg`
    if name == "RPGPolicyLossConfig":
        from rpg.loss_config import RPGPolicyLossConfig

        return RPGPolicyLossConfig
    raise AttributeError(f"module 'rpg' has no attribute {name!r}")
