"""A run that logs to wandb has credentials, or an offline/disabled mode, before Ray starts (docs/gpu.md#wandb).

verl 0.9.1 calls `wandb.init` inside the trainer's `fit()` (verl/trainer/ppo/ray_trainer.py:1419 builds `Tracking`;
verl/utils/tracking.py:79-85 imports wandb and calls `wandb.init` for a `wandb` or `tracking` logger), in the
TaskRunner: after Ray, the workers and vLLM have started, minutes into a GPU run. Without credentials it then stops
the run (or waits for a key on a terminal that nobody reads). So a config whose `trainer.logger` holds `wandb` is
checked here, in the launcher, from what the TaskRunner will see:

* the environment: the launcher's own, updated by `ray_kwargs.ray_init.runtime_env.env_vars` (verl's `run_ppo` starts
  Ray with that runtime environment, so its variables win in every Ray process);
* `WANDB_MODE` `offline` / `disabled` (or `dryrun`), or `WANDB_DISABLED=true`: nothing to authenticate;
* `WANDB_API_KEY` set (non-empty);
* `~/.netrc` (or the file `NETRC` names) with an entry for wandb's host (`wandb login` writes it; host from
  `WANDB_BASE_URL`, default api.wandb.ai) counts only for a local launch (no `RAY_ADDRESS`): in a Ray job the
  TaskRunner runs on a cluster node, whose home is not this one.

`wandb_problem` returns the refusal (the three fixes) or None; the launcher (`check_wandb`) and `rpg-doctor` call it.
"""

from __future__ import annotations

import netrc
import os
import sys
from typing import Any, Mapping, Optional
from urllib.parse import urlparse

from rpg.preflight.compose import RecipeConfigError

OFFLINE_MODES = ("offline", "disabled", "dryrun")
DEFAULT_HOST = "api.wandb.ai"
FIXES = (
    "wandb login (on this node, for a local launch: writes ~/.netrc)",
    "export WANDB_API_KEY=<your key> (a Ray job: also RPG_JOB_ENV=WANDB_API_KEY, or put it in "
    "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY)",
    "export WANDB_MODE=offline (logs under ./wandb; `wandb sync` them later), or drop wandb: "
    "trainer.logger=[console]",
)


def logs_to_wandb(config: Any) -> bool:
    loggers = config.trainer.get("logger", None) or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    return bool({"wandb", "tracking"} & {str(x) for x in loggers})  # verl's Tracking: either starts wandb


def run_environment(config: Any, environ: Mapping[str, str]) -> dict:
    """The environment the TaskRunner sees: `environ` with the Ray runtime environment's env_vars over it."""
    env = dict(environ)
    ray_kwargs = config.get("ray_kwargs", None) or {}
    env_vars = ((ray_kwargs.get("ray_init", None) or {}).get("runtime_env", None) or {}).get("env_vars", None) or {}
    env.update({str(k): str(v) for k, v in dict(env_vars).items() if v is not None})
    return env


def netrc_has(host: str, path: Optional[str] = None) -> bool:
    path = path or os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def credentials(env: Mapping[str, str], local: bool, netrc_path: Optional[str] = None) -> Optional[str]:
    """How wandb would authenticate (or why it need not), or None when it cannot."""
    mode = env.get("WANDB_MODE", "").strip().lower()
    if mode in OFFLINE_MODES:
        return f"WANDB_MODE={mode}: nothing to authenticate"
    if env.get("WANDB_DISABLED", "").strip().lower() in ("1", "true", "yes"):
        return "WANDB_DISABLED: nothing to authenticate"
    if env.get("WANDB_API_KEY", "").strip():
        return "WANDB_API_KEY is set"
    host = urlparse(env.get("WANDB_BASE_URL", "") or "https://" + DEFAULT_HOST).hostname or DEFAULT_HOST
    if local and netrc_has(host, netrc_path):
        return f"a ~/.netrc entry for {host} (wandb login)"
    return None


def wandb_problem(
    config: Any,
    environ: Optional[Mapping[str, str]] = None,
    local: Optional[bool] = None,
    netrc_path: Optional[str] = None,
) -> Optional[str]:
    """The refusal of a run logging to wandb without credentials or an offline mode; None when it has them (or does
    not log to wandb). `local` (default: no RAY_ADDRESS) lets ~/.netrc count."""
    environ = os.environ if environ is None else environ
    if not logs_to_wandb(config):
        return None
    local = not environ.get("RAY_ADDRESS") if local is None else local
    if credentials(run_environment(config, environ), local, netrc_path):
        return None
    where = "the launcher's environment, ray_kwargs.ray_init.runtime_env.env_vars" + (
        " or ~/.netrc" if local else " (a Ray job at RAY_ADDRESS: ~/.netrc on this machine does not count)"
    )
    return (
        f"trainer.logger includes wandb, but wandb has no credentials and no offline mode ({where}: no WANDB_API_KEY, "
        f"WANDB_MODE unset): verl calls wandb.init in the TaskRunner after the workers and vLLM have started, and "
        f"the run would stop there. Fix, one of: " + "; ".join(f"({i}) {fix}" for i, fix in enumerate(FIXES, 1))
    )


def check_wandb(config: Any, *, dry_run: bool, out=None) -> None:
    """The launcher's check: a real launch raises RecipeConfigError; a dry run prints what a launch would refuse."""
    if (problem := wandb_problem(config)) is None:
        return
    if not dry_run:
        raise RecipeConfigError(problem)
    print(f"[rpg] dry run: a real launch would refuse: {problem}", file=out or sys.stderr)
