"""rpg: KL-regularized policy gradients (RPG, ICLR 2026) as a plugin for verl 0.9.1.

Importing `rpg` is cheap. verl loads `rpg.verl_plugin` through the `verl.plugins` entry point on `import verl`
in every process, which registers the RPG policy losses and advantage estimators in verl's own registries.
"""

__version__ = "0.1.0"

__all__ = ["RPGPolicyLossConfig"]


def __getattr__(name):  # lazy: `rpg.RPGPolicyLossConfig` (Hydra `_target_`) without importing verl at `import rpg`
    if name == "RPGPolicyLossConfig":
        from rpg.config import RPGPolicyLossConfig

        return RPGPolicyLossConfig
    raise AttributeError(f"module 'rpg' has no attribute {name!r}")
