"""Digest of every recipe's resolved dry-run config:
`python -m rpg.tools.dry_run_digest [--plans] [--write FILE] [--yaml-dir DIR]`.

For each `recipe/rpg/{7b,4b,cpu}/run_*.sh` it takes the launcher's final command (`RPG_PRINT_ARGV=1`, the environment
cleared of the recipe knobs so the scripts' own defaults apply), composes the overrides in this process as
`RPG_DRY_RUN=1` does (`rpg.launch.compose_config`), renders the resolved YAML, replaces the checkout's directory by
`<repo>` (so the digest is the same in any clone) and prints one line per script: `<profile dir>/<script> <sha256>`.

tests/recipes/dry_run_golden.txt holds these lines for the current recipes; tests/recipes/test_dry_run_on_cpu.py
compares. A deliberate change of a recipe's config regenerates it:
    python -m rpg.tools.dry_run_digest --write tests/recipes/dry_run_golden.txt
and `--yaml-dir DIR` writes each normalised YAML (run it on two commits and diff the folders to see what changed).

What the launcher derives from a validated config has its own golden, tests/recipes/dry_run_plan_golden.txt
(`plan_text`: the dry run's summary, the checkpoint-disk estimate, the GPU memory plan and the smoke overrides, on a
fixed machine: an 80 GiB GPU, torch's cross-entropy path):
    python -m rpg.tools.dry_run_digest --plans --write tests/recipes/dry_run_plan_golden.txt
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

from rpg.atomic import atomic_write_text
from rpg.preflight import recipe_argv as ra

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipe" / "rpg"
PROFILES = ("7b", "4b", "1gpu", "cpu")
#: Environment knobs a developer may have exported: cleared so that each script's own defaults apply (the launcher's
#: knobs, the former script settings it refuses, the CPU profile's sizes, and the launch switches).
CLEARED = (
    *ra.KNOB_NAMES, *ra.REFUSED, *ra.CPU_DEFAULTS,
    *"TINY_DIR RAY_ADDRESS RPG_DRY_RUN PYTHON RPG_PRINT_ARGV VERL_USE_EXTERNAL_MODULES RPG_JOB_ENV RPG_RAY_FOLLOW "
    "RPG_RAY_JOB_ID RPG_MEMORY_PLAN VERL_PLATFORM VERL_ENGINE_DEVICE SMOKE RPG_SMOKE_DIR SMOKE_ROLLOUT "
    "GPU_MEMORY_GIB".split(),
)


def recipe_env(**extra: str) -> dict[str, str]:
    """This process's environment without the `CLEARED` knobs, with `extra` set: what a recipe script is run under
    to see its own defaults (here and in the recipe tests)."""
    return {k: v for k, v in os.environ.items() if k not in CLEARED} | extra


def scripts() -> list[Path]:
    return [p for d in PROFILES for p in sorted((RECIPE / d).glob("run_*.sh"))]


def name(script: Path) -> str:
    return f"{script.parent.name}/{script.name}"


def printed(script: Path) -> dict:
    """The launcher's final command as JSON (`RPG_PRINT_ARGV=1`: bash only, no Python start): `argv` and `env`."""
    env = recipe_env(RPG_PRINT_ARGV="1", RPG_DRY_RUN="1")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{name(script)}: RPG_PRINT_ARGV=1 failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def launch_overrides(command: dict) -> list[str]:
    """The Hydra overrides of a printed command (its argv after `python -m rpg.launch`)."""
    argv = command["argv"]
    assert argv[1:3] == ["-m", "rpg.launch"], argv[:3]
    return argv[3:]


def script_overrides(script: Path) -> list[str]:
    """The Hydra overrides the script passes to `python -m rpg.launch`."""
    return launch_overrides(printed(script))


def normalised(config) -> str:
    """The resolved YAML of a composed config, with the checkout's directory written `<repo>`."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(config, resolve=True).replace(str(REPO), "<repo>")


def normalised_yaml(overrides: list[str]) -> str:
    """The resolved config a dry run prints (`rpg.launch.compose_config` of `overrides`), normalised."""
    from rpg.launch import compose_config  # imports torch: the tests import this module's helpers without it

    return normalised(compose_config(overrides))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def digests(yaml_dir: Optional[Path] = None) -> Iterator[tuple[str, str, str]]:
    """(name, sha256, normalised YAML) of every recipe script."""
    for script in scripts():
        text = normalised_yaml(script_overrides(script))
        if yaml_dir is not None:
            out = yaml_dir / f"{script.parent.name}__{script.stem}.yaml"
            out.write_text(text)
        yield name(script), digest(text), text


#: the machine `plan_text` assumes: an 80 GiB GPU (the memory plan's budget), no flash-attn (torch's cross-entropy)
FIXED_MACHINE = {"GPU_MEMORY_GIB": "80", "VERL_DISABLE_FLASH_ATTN_CE": "1"}
_PROMPTS = re.compile(r"prompt lengths (checked|not checked: [^)]*)")  # whether this machine has the tokenizer


@contextlib.contextmanager
def fixed_machine():
    """`FIXED_MACHINE` in os.environ for the duration (the previous values restored after)."""
    saved = {k: os.environ.get(k) for k in FIXED_MACHINE}
    os.environ.update(FIXED_MACHINE)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def plan_text(validated) -> str:
    """What the launcher derives from a validated recipe config (`rpg.launch.validate`), normalised: the dry run's
    summary (no refusals; whether the prompt lengths were checked is left out), the checkpoint-disk estimate (a hub
    model only: a local model's shape is on this machine or not), the GPU memory plan's breakdown and problems on
    both cross-entropy paths (GPU runs) and the overrides of both smoke launches. Run under `fixed_machine()`."""
    # deferred, as `normalised_yaml`'s: the launcher's modules import torch (the loss table) and Hydra, which the
    # bash-only helpers of this module (`recipe_env`, `printed`, used by the recipe tests) do not need
    from rpg import smoke
    from rpg.preflight import disk
    from rpg.preflight.gpu import is_gpu_run
    from rpg.preflight.memory_config import memory_plan
    from rpg.preflight.summary import summary_lines

    config = validated.config
    lines = [_PROMPTS.sub("prompt lengths <this machine>", x) for x in summary_lines(validated, [])]
    if os.path.isabs(os.path.expanduser(str(config.actor_rollout_ref.model.path))):
        lines.append("disk: a local model (not estimated here)")
    else:
        est = disk.estimate(validated)
        lines += [f"disk: {k} {v:.0f} B" for k, v in est.parts.items()] + [f"disk: {est.copies} copies ({est.why})"]
    if is_gpu_run(config):
        for flash_ce in (False, True):
            plan = memory_plan(validated, budget_gib=80.0, flash_ce=flash_ce)
            lines += [f"plan (flash_ce={flash_ce}): {x}" for x in plan.breakdown().splitlines() + plan.problems()]
    paths = smoke.SmokePaths(Path("/smoke"), str(config.trainer.experiment_name))
    for phase in (smoke.SAVE, smoke.RESUME):
        lines.append(f"smoke {phase}: " + " ".join(smoke.smoke_overrides(validated, paths, phase)))
    return "\n".join(lines).replace(str(REPO), "<repo>") + "\n"


def plan_digests(yaml_dir: Optional[Path] = None) -> Iterator[tuple[str, str, str]]:
    """(name, sha256, `plan_text`) of every recipe script."""
    from rpg.launch import compose_and_validate

    with fixed_machine():
        for script in scripts():
            text = plan_text(compose_and_validate(script_overrides(script)))
            if yaml_dir is not None:
                (yaml_dir / f"{script.parent.name}__{script.stem}.plan.txt").write_text(text)
            yield name(script), digest(text), text


def read_golden(path: Path) -> dict[str, str]:
    return dict(line.split() for line in path.read_text().splitlines() if line and not line.startswith("#"))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the digest lines to this file (atomically)")
    parser.add_argument("--yaml-dir", type=Path, help="also write each normalised YAML into this folder")
    parser.add_argument("--plans", action="store_true", help="digest `plan_text` (summary, disk, memory plan, smoke)")
    args = parser.parse_args(argv)
    if args.yaml_dir:
        args.yaml_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"{n} {h}" for n, h, _ in (plan_digests if args.plans else digests)(args.yaml_dir)]
    command = "python -m rpg.tools.dry_run_digest" + (" --plans" if args.plans else "")
    golden = "dry_run_plan_golden.txt" if args.plans else "dry_run_golden.txt"
    text = f"# {command} --write tests/recipes/{golden}\n" + "\n".join(lines) + "\n"
    if args.write:
        atomic_write_text(args.write, text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
