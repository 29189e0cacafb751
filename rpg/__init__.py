"""rpg: KL-regularized policy gradients (RPG, ICLR 2026) as a plugin for verl 0.9.1.

verl loads `rpg.verl_plugin` through the `verl.plugins` entry point on `import verl` in every process, which registers
the RPG policy losses and advantage estimators in verl's own registries and installs what the run's `RPG_INSTALL`
names (`rpg.install`, the one place that changes verl for a run).

Importing an rpg module that needs verl imports verl first (`_VerlFirst` below): without it, `import rpg.<module>`
before verl would start verl's plugin loading while that rpg module is half-initialised; verl swallows the resulting
ImportError and no RPG name would be registered in that process (tests/test_registration_on_cpu.py checks every
import order). `import rpg` itself does not import verl (about 6 s), nor do the modules of `VERL_FREE`: the launcher's
early checks (`rpg.preflight.early`) refuse a misspelt loss or option before verl is imported.
"""

import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

__all__ = ["RPGPolicyLossConfig"]

# Modules whose import never imports verl (their verl imports are inside functions): the launcher's early path.
VERL_FREE = ("rpg.launch", "rpg.preflight", "rpg.loss_table", "rpg.divergences", "rpg.modes")


def __getattr__(name):  # lazy: `rpg.RPGPolicyLossConfig` (Hydra `_target_`) without importing verl at `import rpg`
    if name == "RPGPolicyLossConfig":
        from rpg.loss_config import RPGPolicyLossConfig

        return RPGPolicyLossConfig
    raise AttributeError(f"module 'rpg' has no attribute {name!r}")


class _Imported(importlib.abc.Loader):
    """The loader of a module that verl's plugin loading imported while `_VerlFirst` was finding it: hands the import
    system that module object, so it is not executed twice."""

    def __init__(self, module):
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__ = self.spec


class _VerlFirst(importlib.abc.MetaPathFinder):
    """Imports verl (hence the plugin) before the first rpg submodule outside `VERL_FREE` starts executing; then
    leaves `sys.meta_path`."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("rpg.") or name.startswith(tuple(m + "." for m in VERL_FREE)) or name in VERL_FREE:
            return None
        if "verl" in sys.modules:  # imported already, or being imported (its plugin loading imports rpg modules)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            return None
        import verl  # noqa: F401  (loads the `verl.plugins` entry points: rpg.verl_plugin, which may import `name`)

        if self in sys.meta_path:
            sys.meta_path.remove(self)
        module = sys.modules.pop(name, None)
        return None if module is None else importlib.util.spec_from_loader(name, _Imported(module))


if "verl" not in sys.modules and not any(isinstance(f, _VerlFirst) for f in sys.meta_path):
    sys.meta_path.insert(0, _VerlFirst())
