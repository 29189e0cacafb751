"""`python -m rpg.launch <hydra overrides>`: verl 0.9.1's PPO entry point with every check done up front.

The recipe launcher (`recipe/rpg/common.sh`, through `rpg.preflight.recipe_argv`) runs this module instead of
`python -m verl.trainer.main_ppo`. It is a thin Hydra entry over the package's `rpg/config/rpg_trainer.yaml`: verl's
own `ppo_trainer` config (from the installed `verl.trainer.config` package, so every key and default is verl's) plus
the settings all RPG recipes share and the recipe's config groups (setup, method, optim, profile). Before verl is
imported (`rpg.preflight.early`: `--help`, an interpreter without verl, a misspelt loss_mode, adv_estimator or
policy_loss option, each with the closest names and `--list`), and then before any Ray process starts, it resolves
the recipe's variables and every `oc.env` in this process (`finish`), then it

1. builds the typed config dataclasses that verl's trainer and workers build later (actor, reference, rollout,
   model, algorithm, reward manager, checkpoint engine), so a misspelt `+key` or a bad value fails here instead of
   minutes later inside a worker on the cluster;
2. runs verl's `validate_config` exactly as `verl/trainer/main_ppo.py:main` does;
3. checks the recipe-level rules verl cannot know about (`validate_rpg`, `validate_recipe`: among them the context
   length against the model, run names, and a scorer for every data source and ground truth of the local data);
4. checks that every local path exists (`check_paths`: model, data files, resume path): a dry run reports a missing
   one on stderr, a real launch refuses it; and that every prompt of the local data, rendered with the model's chat
   template, fits `data.max_prompt_length` (`rpg.preflight.prompts`);
5. for a GPU run (`rpg.preflight.gpu`), prints the per-GPU memory plan in one line and refuses a plan over budget,
   and checks that this node has what a local launch needs (vLLM, flash-attn, the GPUs; a dry run only warns);
6. then either prints the resolved config as YAML and a summary (`rpg.preflight.summary`) and exits (`RPG_DRY_RUN=1`,
   no Ray, a few seconds) or hands the config to verl's `run_ppo` with verl's own TaskRunner (v1, or the legacy one
   if `trainer.use_v1=False`), with two additions: for a run that selects a mode needing more than registered names
   (a frozen, periodic or EMA reference, an adaptive β, `grpo_wk3`, schedule-free), `RPG_INSTALL` in the Ray runtime
   environment (`rpg.install`, the one installation point, run by the plugin entry point at `import verl` in every
   process); with several nodes that save, Ray being up, the TaskRunner starts only once every node has seen the same
   `CKPTS_DIR` (`rpg.preflight.shared_ckpt`).

`SMOKE=1` (`rpg.smoke`) appends the smoke overrides to the recipe's (2 steps, the smallest batch that fills every
rank; verl's file log in `RPG_SMOKE_DIR`, default outputs/smoke), samples the GPUs' memory during the run and prints
the smoke report after it; with `RPG_DRY_RUN=1` it prints the smoke config.

`+key=value` overrides are treated as `++key=value` (add or override), so a key added by a recipe or the yaml (e.g.
`+actor_rollout_ref.actor.policy_loss.kl_coef`) can be set again by a script or on the command line; the RPG settings
of `policy_loss` (kl_coef, reference, ...) may be given with or without the `+`.

The checks live in `rpg.preflight`, one module per concept: `compose` (Hydra composition), `verl_configs` (verl's
dataclasses and `validate_config`), `rpg_rules` (the loss rules), `recipe_rules` (recipe-level rules), `inputs`
(paths, context length, data coverage), `gpu` (memory plan, engines, GPUs), `memory` (the plan's estimator),
`memory_config` (a validated run's memory plan); `recipe_argv` turns a recipe script's line and the environment knobs
into this module's command line and `ray_submit` submits it to a Ray cluster. This module reads top to bottom:
compose → checks → dry run or launch. Every check after `validate` reads the `ValidatedConfig` it returns.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import Optional, Sequence

from rpg.preflight import early, keys, refusal  # stdlib only: `--help`, no verl, misspelt names and keys

if __name__ == "__main__" and (_problem := early.verl_problem()):  # say what to do, not ModuleNotFoundError
    raise SystemExit(f"[rpg] error: {_problem}")

from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rpg import addon_bases, install, smoke  # noqa: E402
from rpg.loss_table import describe_losses  # noqa: E402
from rpg.preflight import shared_ckpt  # noqa: E402
from rpg.preflight.compose import (  # noqa: F401,E402  (public names of rpg.launch)
    CONFIG_DIR,
    CONFIG_NAME,
    POLICY_LOSS_PREFIX,
    RecipeConfigError,
    compose_config,
    finish,
    normalise_overrides,
)
from rpg.preflight.disk import problem as checkpoint_disk_problem  # noqa: E402
from rpg.preflight.gpu import check_gpu_launch, is_gpu_run  # noqa: E402
from rpg.preflight.inputs import PATH_RULES, RECIPE_KNOBS, RESUME_MODES, check_paths  # noqa: F401,E402
from rpg.preflight.prompts import prompt_length_problems  # noqa: E402
from rpg.preflight.resume_ckpt import problem as resume_problem  # noqa: E402
from rpg.preflight.recipe_rules import (  # noqa: F401,E402
    OVERLONG_BUFFER_KEYS,
    RECIPE_RULES,
    THINKING_KEY,
    async_correction_warning,
    chat_template_summary,
    validate_recipe,
)
from rpg.preflight.rpg_rules import RPG_POLICY_LOSS_TARGETS, RPG_RULES, check_registered, validate_rpg  # noqa: F401,E402
from rpg.preflight.summary import launch_refusals, summary_lines  # noqa: E402
from rpg.preflight.wandb_check import check_wandb  # noqa: E402
from rpg import ray_start  # noqa: E402
from rpg.preflight.validation import compose_and_validate, validate  # noqa: F401,E402  (public names of rpg.launch)
from rpg.preflight.verl_configs import ValidatedConfig, build_verl_configs  # noqa: F401,E402

DRY_RUN_ENV = "RPG_DRY_RUN"
SMOKE_DIR_ENV = "RPG_SMOKE_DIR"
SUMMARY_ONLY = "summary"  # RPG_DRY_RUN=summary: a dry run that prints only the summary (no YAML)
_TRUE, _FALSE = ("1", "true", "yes", "on", SUMMARY_ONLY), ("", "0", "false", "no", "off")


# --------------------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------------------
def dry_run_requested(environ=None) -> bool:
    environ = os.environ if environ is None else environ  # read now: `datasets` (num_proc) replaces os.environ
    value = environ.get(DRY_RUN_ENV, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise RecipeConfigError(f"{DRY_RUN_ENV}={environ[DRY_RUN_ENV]!r} is not valid; use 1 (dry run), "
                                f"{SUMMARY_ONLY} (a dry run printing only its summary) or 0")
    return value in _TRUE


@dataclasses.dataclass
class SmokeRun:
    """A smoke run (`SMOKE=1`, `rpg.smoke`): the recipe without the smoke overrides, validated, its smoke folder, and
    which launch this process is (`rpg.smoke.SAVE`/`RESUME`; None: the launcher that runs both)."""

    full: ValidatedConfig
    paths: smoke.SmokePaths
    phase: Optional[str]
    rollout: str = "small"

    @property
    def log(self) -> Path:
        return self.paths.phase_log(self.phase or "")


def smoke_setup(args: Sequence[str], dry_run: bool) -> tuple[list[str], Optional[SmokeRun]]:
    """With SMOKE=1: the overrides to append to `args` (`rpg.smoke.smoke_overrides` of the composed recipe, for this
    process's launch; smoke folder RPG_SMOKE_DIR, default outputs/smoke) and the `SmokeRun`; else ([], None). A dry
    run shows launch 2's config (the resumed step 2 and its validation) and makes no folder."""
    try:
        if not smoke.smoke_requested():
            return [], None
        rollout = smoke.smoke_rollout()
    except ValueError as e:
        raise RecipeConfigError(str(e)) from None
    full = validate(compose_config(args))  # the recipe's own config: its smoke overrides and report read it
    if rollout == "full" and str(full.config.trainer.device) == "cpu":
        raise RecipeConfigError(f"{smoke.ROLLOUT_ENV}=full decodes the recipe's whole batch to reach the GPU's "
                                "KV-cache and sampler peak; a CPU run has neither: unset it")
    paths = smoke.smoke_paths(full, os.environ.get(SMOKE_DIR_ENV) or "outputs/smoke")
    phase = os.environ.get(smoke.PHASE_ENV) or (smoke.RESUME if dry_run else None)
    if phase not in (None, smoke.SAVE, smoke.RESUME):
        raise RecipeConfigError(f"{smoke.PHASE_ENV}={phase!r} is internal to SMOKE=1; unset it")
    overrides = smoke.smoke_overrides(full, paths, phase, rollout) if phase else []
    return overrides, SmokeRun(full, paths, phase, rollout)


def smoke_dry_run_save(args: Sequence[str], smoke_run: SmokeRun) -> None:
    """A smoke dry run's launch 1 of 2 (save), dry-run in this process before Hydra runs launch 2 (resume); nothing
    when RPG_SMOKE_PHASE names the one launch to show."""
    if os.environ.get(smoke.PHASE_ENV):
        return
    save = dataclasses.replace(smoke_run, phase=smoke.SAVE)
    with refusal.as_message():
        overrides = smoke.smoke_overrides(smoke_run.full, smoke_run.paths, smoke.SAVE, smoke_run.rollout)
        run(compose_config([*args, *overrides]), save)


def run(config: DictConfig, smoke_run: Optional[SmokeRun] = None) -> None:
    """Validate, then dry-run (print YAML) or train with verl's `run_ppo`, as `verl.trainer.main_ppo.main` does; a
    smoke run then prints its report (`rpg.smoke.summarize`)."""
    from verl.utils.device import auto_set_device

    finish(config)  # the recipe variables and every oc.env resolved here, before Ray (rpg.preflight.compose)
    auto_set_device(config)
    dry_run = dry_run_requested()
    validated = validate(config, real_launch=not dry_run)
    if smoke_run is not None:  # the smoke report's token share over |Δ log p| > log 2 (rpg.mismatch)
        validated.install = smoke_install(validated.install)
    print(chat_template_summary(config), file=sys.stderr)
    if warning := async_correction_warning(config):  # asynchronous without TIS weights: docs/async.md#no-correction
        print(warning, file=sys.stderr)
    check_wandb(config, dry_run=dry_run)  # wandb's credentials or offline mode, not at wandb.init minutes in
    if warning := addon_bases.config_warning(validated):  # the add-on base's clip (docs/losses.md#addon-bases)
        print(warning, file=sys.stderr)
    # GPU runs: the memory plan line (over budget: an error), then what this node lacks for a local launch
    check_gpu_launch(validated, dry_run=dry_run, local=not os.environ.get("RAY_ADDRESS"))
    if smoke_run is not None:
        print(f"[rpg] smoke run (SMOKE=1), {_smoke_launch(smoke_run)}: {config.trainer.total_training_steps} steps of "
              f"{config.data.train_batch_size} prompts, metrics to {smoke_run.log}, checkpoints in "
              f"{config.trainer.default_local_dir}", file=sys.stderr)
    # the checkpoints: this launch's fit on their disk, the one a resume would read is complete (rpg.preflight)
    checkpoint_problems = [p for p in (disk_problem(validated), resume_problem(config)) if p]
    if checkpoint_problems and not dry_run:
        raise RecipeConfigError(checkpoint_problems[0])
    if dry_run:
        for problem in [*validated.path_problems, *checkpoint_problems]:
            print(f"[rpg] dry run: a real launch would refuse: {problem}", file=sys.stderr)
        if os.environ.get(DRY_RUN_ENV, "").strip().lower() != SUMMARY_ONLY:
            sys.stdout.write(OmegaConf.to_yaml(config, resolve=True))
        refusals = launch_refusals(validated, local=not os.environ.get("RAY_ADDRESS"))
        refusals += checkpoint_problems  # every refusal of a real launch is in the summary
        smoke_line = None
        if smoke_run is not None:
            smoke_line = (f"{_smoke_launch(smoke_run)}, {config.trainer.total_training_steps} steps, metrics to "
                          f"{smoke_run.log}")
        print("\n".join(summary_lines(validated, refusals, smoke_line)))  # the last lines: what a person reads
        sys.stdout.flush()
        return
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    quiet_engine_warnings(os.environ)  # and in the Ray processes this launch starts

    if validated.install:  # every Ray process installs it at `import verl` (rpg.install, rpg.verl_plugin)
        value = install.export(config, validated.install)
        print(f"[rpg] {install.ENV}={value}: installed in every process of the run (rpg/install.py)", file=sys.stderr)

    if config.trainer.use_v1:
        runner = TaskRunnerV1
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner as runner
    if shared_ckpt.needs_check(config):  # several nodes that save: CKPTS_DIR shared, checked once Ray is up
        runner = shared_ckpt.CheckedTaskRunner(runner, config)
    try:
        with ray_start.for_run(cpu=not is_gpu_run(config)):  # a CPU run's patient Ray start (rpg/ray_start.py)
            run_ppo(config, task_runner_class=runner)
    except Exception as e:  # noqa: BLE001 -- only the run-stopping conditions we name are turned into messages
        stop = stop_message(e)
        if stop is None:
            raise
        raise SystemExit(f"[rpg] error: {stop}") from None


def _smoke_launch(smoke_run: SmokeRun) -> str:
    """Which of the smoke run's two launches this process is, in words."""
    return f"launch {1 if smoke_run.phase == smoke.SAVE else 2} of 2"


def smoke_install(selection: tuple[str, ...]) -> tuple[str, ...]:
    """What a smoke run installs (`rpg.install.for_smoke`); an unsupported verl is a refusal before Ray."""
    try:
        return install.for_smoke(selection)
    except RuntimeError as e:
        raise RecipeConfigError(f"invalid RPG configuration:\n- {e}") from None


def disk_problem(validated: ValidatedConfig) -> Optional[str]:
    """Why trainer.default_local_dir cannot hold the checkpoints of the validated run (`rpg.preflight.disk`), or
    None."""
    return checkpoint_disk_problem(validated)


def stop_message(error: BaseException) -> Optional[str]:
    """The message of a condition that stops a run on purpose (`rpg.dynamic_sampling.DynamicSamplingExhausted`),
    raised in the TaskRunner and re-raised by Ray (its `cause`); None for any other error."""
    from rpg.dynamic_sampling import DynamicSamplingExhausted  # deferred: it imports verl's replay buffer

    for candidate in (getattr(error, "cause", None), error):
        if isinstance(candidate, DynamicSamplingExhausted):
            return str(candidate.args[0]) if candidate.args else str(candidate)
    return None


def list_losses(args: Sequence[str]) -> None:
    """`python -m rpg.launch --list [--markdown]`: print the loss table and verl's own names (the README's table with
    `--markdown`)."""
    extra = [a for a in args if a != "--markdown"]
    if extra:
        raise SystemExit(f"python -m rpg.launch --list takes only --markdown, got {extra}")
    markdown = "--markdown" in args
    sys.stdout.write(describe_losses(markdown=markdown) + ("" if markdown else early.list_text()))


# verl 0.9.1's optional engines (verl/workers/engine/__init__.py warns "<name> engine is not available: ..." for each)
OPTIONAL_ENGINES = ("torchtitan", "veomni", "automodel", "mindspeed", "megatron")


def quiet_engine_warnings(environ=None) -> None:
    """verl warns once per optional engine it cannot import, in every process that imports it: not shown in the
    launcher's output (the FSDP engine the recipes use is checked by building the config). Here by a warnings filter;
    with `environ` (a launch: the processes of a local Ray cluster inherit it) also by PYTHONWARNINGS, whose message
    field matches the start of a warning."""
    warnings.filterwarnings("ignore", message=r"\w+ engine is not available", category=UserWarning)
    if environ is not None:
        ours = [f"ignore:{name} engine is not available:UserWarning" for name in OPTIONAL_ENGINES]
        theirs = [f for f in environ.get("PYTHONWARNINGS", "").split(",") if f and f not in ours]
        environ["PYTHONWARNINGS"] = ",".join(theirs + ours)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        return print(early.HELP, end="")
    if args[:1] == ["--list"]:
        return list_losses(args[1:])
    if args[:1] == ["--help-config"]:  # Hydra's own help: the config groups and the full default config
        args = ["--help", *args[1:]]
    elif problems := early.check_overrides(args) + keys.key_problems(args):  # before verl: a misspelt name, any key
        raise SystemExit("[rpg] error: " + "\n[rpg] error: ".join(problems))
    quiet_engine_warnings()
    import hydra

    try:
        dry_run = dry_run_requested()
        smoke_overrides, smoke_run = smoke_setup(args, dry_run)
    except RecipeConfigError as e:
        raise SystemExit(f"[rpg] error: {e}") from None
    if smoke_run is not None and smoke_run.phase is None:  # SMOKE=1: this process runs the smoke run's two launches
        try:
            if problem := disk_problem(smoke_run.full):  # the real run's checkpoints, in CKPTS_DIR
                raise RecipeConfigError(problem)
            smoke.run_launches(args, smoke_run.full, smoke_run.paths, smoke_run.rollout)
        except (RecipeConfigError, ValueError, RuntimeError) as e:
            raise SystemExit(f"[rpg] error: {e}") from None
        return
    if dry_run and smoke_run is not None:  # a smoke dry run shows both launches: launch 1 here, launch 2 below
        smoke_dry_run_save(args, smoke_run)
    args += smoke_overrides  # after the recipe's: they win
    if dry_run:  # no run directory, no log file: a dry run leaves nothing behind
        args += ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=disabled"]
    sys.argv = [sys.argv[0], *normalise_overrides(args)]

    def task(config: DictConfig) -> None:
        with refusal.as_message():  # the project's refusals: one paragraph, exit 1 (rpg.preflight.refusal)
            run(config, smoke_run)

    hydra.main(config_path=str(CONFIG_DIR), config_name=CONFIG_NAME, version_base=None)(task)()


if __name__ == "__main__":
    main()
