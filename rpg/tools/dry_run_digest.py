"""Digest of every recipe's resolved dry-run config: `python -m rpg.tools.dry_run_digest [--write FILE] [--yaml-dir DIR]`.

For each `recipe/rpg/{7b,4b,cpu}/run_*.sh` it takes the launcher's final command (`RPG_PRINT_ARGV=1`, the environment
cleared of the recipe knobs so the scripts' own defaults apply), composes the overrides in this process as
`RPG_DRY_RUN=1` does (`rpg.launch.compose_config`), renders the resolved YAML, replaces the checkout's directory by
`<repo>` (so the digest is the same in any clone) and prints one line per script: `<profile dir>/<script> <sha256>`.

tests/recipes/dry_run_golden.txt holds these lines for the current recipes; tests/recipes/test_dry_run_on_cpu.py
compares. A deliberate change of a recipe's config regenerates it:
    python -m rpg.tools.dry_run_digest --write tests/recipes/dry_run_golden.txt
and `--yaml-dir DIR` writes each normalised YAML (run it on two commits and diff the folders to see what changed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

from rpg.atomic import atomic_write_text
from rpg.preflight import recipe_argv as ra

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipe" / "rpg"
PROFILES = ("7b", "4b", "cpu")
#: Environment knobs a developer may have exported: cleared so that each script's own defaults apply (the launcher's
#: knobs, the former script settings it refuses, the CPU profile's sizes, and the launch switches).
CLEARED = (
    *ra.KNOB_NAMES, *ra.REFUSED, *ra.CPU_DEFAULTS,
    *"TINY_DIR RAY_ADDRESS RPG_DRY_RUN PYTHON RPG_PRINT_ARGV VERL_USE_EXTERNAL_MODULES RPG_JOB_ENV RPG_RAY_FOLLOW "
    "RPG_RAY_JOB_ID RPG_MEMORY_PLAN VERL_PLATFORM VERL_ENGINE_DEVICE SMOKE RPG_SMOKE_DIR SMOKE_ROLLOUT GPU_MEMORY_GIB".split(),
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


def read_golden(path: Path) -> dict[str, str]:
    return dict(line.split() for line in path.read_text().splitlines() if line and not line.startswith("#"))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the digest lines to this file (atomically)")
    parser.add_argument("--yaml-dir", type=Path, help="also write each normalised YAML into this folder")
    args = parser.parse_args(argv)
    if args.yaml_dir:
        args.yaml_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"{n} {h}" for n, h, _ in digests(args.yaml_dir)]
    text = "# python -m rpg.tools.dry_run_digest --write tests/recipes/dry_run_golden.txt\n" + "\n".join(lines) + "\n"
    if args.write:
        atomic_write_text(args.write, text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
