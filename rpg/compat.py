"""Guards for the few places where rpg-verl wraps or replaces a verl object (no extension point exists there).

Every such patch in the package calls both guards before it touches verl, so that a verl version it was not written
for fails at start-up with a message naming the package, the installed and supported versions, the wrapped object,
and the patch, instead of misbehaving later inside a worker:

    require_version("verl", SUPPORTED_VERL, what="the ref_log_prob adapter around verl's ppo_loss")
    require_signature(losses.ppo_loss, ("config", "model_output", "data", "dp_group"), what="...")

The patches that use them: every row of the table of patch points (`rpg.patches`: each row names its verl version
range and the parameters of what it wraps), the CPU-platform shims (`rpg/cpu/platform.py`) and the vLLM CPU patches
(`rpg/cpu/vllm_compat.py`). Registrations through verl's registries need no signature guard.

`SUPPORTED_VERL` is `>=0.9.1,<0.10`: the patches were written against verl 0.9.1 (the version `pyproject.toml`
pins), and verl is a 0.x project whose minor releases move worker internals. Patch releases of 0.9 are accepted
because the signature checks catch a change in what is wrapped; a new minor version needs a review of the patches
and a new range here.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import inspect
from typing import Callable, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = ["SUPPORTED_VERL", "installed_version", "require_signature", "require_version"]

SUPPORTED_VERL = ">=0.9.1,<0.10"


def installed_version(package: str) -> Optional[str]:
    """The installed version of `package` (distribution metadata, else the module's `__version__`), or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        pass
    try:
        return getattr(importlib.import_module(package), "__version__", None)
    except ImportError:
        return None


def require_version(package: str, spec: str, what: str) -> str:
    """Return the installed version of `package`; raise RuntimeError unless it satisfies `spec` (e.g. ">=0.9.1,<0.10").

    `what` names the patch that needs it. Pre-releases inside the range are accepted (a 0.9.2rc1 is a 0.9 release).
    """
    version = installed_version(package)
    try:
        ok = version is not None and SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise RuntimeError(
            f"{what} supports {package}{spec}, but {package} {version or '(not installed)'} is installed. Install a "
            f"supported version (pip install '{package}{spec}'), or use a rpg-verl release written for "
            f"{package} {version}."
        )
    return version


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"


def require_signature(fn: Callable, params: tuple[str, ...], what: str) -> None:
    """Raise RuntimeError unless `fn`'s parameter names are exactly `params`, in order.

    Decorators that use `functools.wraps` are seen through (as `inspect.signature` does), so for a verl method
    decorated with `@register(...)` the names are those of the method itself, `self` included. The keyword Ray adds to
    the methods of a class once that class (or a subclass) has passed through `ray.remote` (`_ray_trace_ctx`) is not
    part of verl's signature and is ignored.
    """
    try:
        actual = tuple(p for p in inspect.signature(fn).parameters if p != "_ray_trace_ctx")
    except (TypeError, ValueError) as e:
        raise RuntimeError(f"{what}: cannot read the signature of {_qualname(fn)} ({e}); expected {params}") from e
    if actual != tuple(params):
        package = str(getattr(fn, "__module__", "?")).split(".")[0]
        raise RuntimeError(
            f"{what} was written for {_qualname(fn)}{tuple(params)}, but the installed {package} "
            f"{installed_version(package) or '?'} has {_qualname(fn)}{actual}. rpg-verl supports verl{SUPPORTED_VERL} "
            f"with the packages it pins (requirements.txt)."
        )
