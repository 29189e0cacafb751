"""The recipe knobs and the command they build: `recipe/rpg/common.sh`'s `rpg_run` hands its knob values here.

Run as a file by the shell (`$PYTHON rpg/preflight/recipe_argv.py ...`), with the standard library only: importing the
`rpg` package imports verl (seconds), which the print mode and a Ray submission do not need.

* `KNOBS` is the one list of the recipe knobs (name, default, Hydra key, meaning). `--shell-defaults` prints the shell
  assignments common.sh evaluates when it is sourced (the script knobs reset to their defaults, so a value exported by
  the user never leaks into a script that does not set it, and `RPG_KNOB_NAMES`); the knob tables of README.md and
  recipe/rpg/README.md are generated from it (`--markdown`, between `<!-- knobs -->` markers, checked by the tests).
* `build` turns the knob values into `python -m rpg.launch <Hydra overrides>`: paths quoted as Hydra strings, the
  token budgets and the overlong buffer computed from the context, the RPG settings passed only when set.
* `main` then prints the command and its environment as JSON (`RPG_PRINT_ARGV=1`), runs it here (`os.execvpe`), or
  submits it to the Ray cluster at `RAY_ADDRESS` (`ray_submit.py`, Ray's job-submission SDK).

Command line (from common.sh): `--repo DIR --script NAME --python PY` then any of `--knob NAME=VALUE`,
`--profile-override O`, `--optim-override O`, `--script-override O`, `--job-env NAME` (each flag takes one value),
then `--` and the user's own overrides.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Dict, List, NamedTuple, Optional

PLUGIN_MODULE = "rpg.verl_plugin"
#: Environment variables every launch passes on (printed by RPG_PRINT_ARGV, sent to a Ray job).
FORWARDED_ENV = ("VERL_USE_EXTERNAL_MODULES", "RPG_DRY_RUN", "WANDB_MODE", "SMOKE", "RPG_SMOKE_DIR", "SMOKE_ROLLOUT",
                 "GPU_MEMORY_GIB", "RPG_SHARED_CKPT")


class Knob(NamedTuple):
    name: str
    default: Optional[str]  # None: not passed when unset (the config's default applies)
    key: str  # the Hydra key it sets ("" when it only selects something)
    meaning: str
    script: bool = False  # a script knob: reset to its default when common.sh is sourced (set by scripts and presets)


KNOBS = (
    # ---- environment knobs (the CPU profile may set its own defaults; a value from the environment wins)
    Knob("MODEL_PATH", "Qwen/Qwen3-4B", "actor_rollout_ref.model.path",
         "model directory or hub id (setup_* set the paper's model)"),
    Knob("DATA_DIR", "<repo>/data", "", "folder of the parquet files (python -m rpg.tools.prepare_data)"),
    Knob("TRAIN_FILE", "$DATA_DIR/dapo-math-17k-eng.parquet", "data.train_files",
         "one path, several one per line, or a Hydra list \"['a.parquet','b.parquet']\""),
    Knob("TEST_FILE", "$DATA_DIR/<name>.parquet for each of VAL_SETS", "data.val_files", "as TRAIN_FILE"),
    Knob("CKPTS_DIR", "<repo>/ckpts/$PROJECT_NAME/$EXP_NAME", "trainer.default_local_dir", "checkpoint folder"),
    Knob("NNODES", "1", "trainer.nnodes", "nodes"),
    Knob("N_GPUS", "8", "trainer.n_gpus_per_node", "GPUs per node"),
    Knob("PROJECT_NAME", "rpg-verl", "trainer.project_name", "run name: project"),
    Knob("EXP_NAME", "the script's name", "trainer.experiment_name", "run name: experiment"),
    Knob("THINKING", None, "", "Qwen3-4B scripts only: false (default) | true, Qwen3's thinking mode"),
    Knob("REF_REFRESH_STEPS", None, "+actor_rollout_ref.actor.policy_loss.ref_refresh_steps",
         "periodic reference: K optimizer steps between refreshes"),
    Knob("REF_REFRESH_KL", None, "+actor_rollout_ref.actor.policy_loss.ref_refresh_kl",
         "periodic reference: refresh when the token-KL moving average exceeds κ"),
    Knob("OLD_LOGPROB", "recompute", "algorithm.rollout_correction.bypass_mode",
         "π_old: recompute (the paper's: the actor's forward before the update) | rollout (bypass_mode=True: the "
         "rollout's log-probs, no forward; docs/async.md#knobs)"),
    Knob("TRAINER_MODE", "sync", "trainer.v1.trainer_mode",
         "verl's v1 trainer: sync (the paper's) | colocate_async | separate_async (docs/async.md#knobs)"),
    # ---- script knobs (set by setup_*, preset_* and the scripts; defaults = the paper's RPG setup)
    Knob("CTX", "2", "", "context in K tokens: max prompt = max response = CTX*1024 (paper App. H)", True),
    Knob("PROMPT_LEN", "", "data.max_prompt_length", "override the prompt length (default CTX*1024)", True),
    Knob("RESPONSE_LEN", "", "data.max_response_length", "override the response length (default CTX*1024)", True),
    Knob("TOKEN_LEN_FACTOR", "1", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
         "dynamic-batch token budget per GPU = factor × (prompt + response) (docs/differences.md#d14)", True),
    Knob("LR", "1e-6", "actor_rollout_ref.actor.optim.lr", "learning rate", True),
    Knob("ADV_ESTIMATOR", "rpg", "algorithm.adv_estimator", "advantage estimator", True),
    Knob("LOSS_MODE", "vanilla", "actor_rollout_ref.actor.policy_loss.loss_mode", "policy loss", True),
    Knob("KL_COEF", "", "+actor_rollout_ref.actor.policy_loss.kl_coef",
         "β of an RPG loss; empty: RPGPolicyLossConfig's default", True),
    Knob("REFERENCE", "", "+actor_rollout_ref.actor.policy_loss.reference",
         "KL reference of an RPG loss: iterative (default) | frozen | periodic", True),
    Knob("CLIP_LOW", "0.2", "actor_rollout_ref.actor.clip_ratio_low", "ratio clip ε1", True),
    Knob("CLIP_HIGH", "0.28", "actor_rollout_ref.actor.clip_ratio_high", "ratio clip ε2", True),
    Knob("USE_KL_LOSS", "False", "actor_rollout_ref.actor.use_kl_loss",
         "verl's own KL loss against a frozen reference model (GRPO, REINFORCE++)", True),
    Knob("KL_LOSS_TYPE", "low_var_kl", "actor_rollout_ref.actor.kl_loss_type", "verl's KL loss type", True),
    Knob("KL_LOSS_COEF", "0.0", "actor_rollout_ref.actor.kl_loss_coef", "verl's KL loss coefficient", True),
    Knob("DYNAMIC_SAMPLING", "True", "algorithm.filter_groups.enable", "DAPO group filtering on acc", True),
    Knob("OVERLONG", "True", "reward.reward_kwargs.overlong_buffer_cfg.enable",
         "DAPO overlong penalty, buffer = response length / 4", True),
    Knob("VAL_SETS", "aime-2024 aime-2025 amc-2023", "", "validation sets (files DATA_DIR/<name>.parquet)", True),
    Knob("GPU_MEMORY_UTILIZATION", "", "actor_rollout_ref.rollout.gpu_memory_utilization",
         "vLLM's pool as a fraction of each GPU's total memory; empty: the config's 0.85 (7B setups: 0.8, "
         "docs/differences.md#d28)", True),
    Knob("ENABLE_THINKING", "", "+data.apply_chat_template_kwargs.enable_thinking",
         "Qwen3 chat template (setup_qwen3_4b sets it from THINKING); empty: not passed", True),
)  # fmt: skip
KNOB_NAMES = tuple(k.name for k in KNOBS)


class KnobError(ValueError):
    """A knob value that cannot build a command (the shell prints it and exits 2)."""


#: Knobs with a fixed set of values: name -> {value: Hydra overrides} (the default's: none, the config's default).
CHOICES: Dict[str, Dict[str, List[str]]] = {
    "OLD_LOGPROB": {"recompute": [], "rollout": ["algorithm.rollout_correction.bypass_mode=True"]},
    "TRAINER_MODE": {m: [] if m == "sync" else [f"trainer.v1.trainer_mode={m}"]
                     for m in ("sync", "colocate_async", "separate_async")},
}  # fmt: skip


def _choice(knobs: Dict[str, str], name: str) -> List[str]:
    """The overrides of a knob with fixed values (CHOICES); a value outside them is a KnobError listing them."""
    default = next(k.default for k in KNOBS if k.name == name)
    value = knobs.get(name) or default
    if value not in CHOICES[name]:
        raise KnobError(f"{name}='{value}' is not valid; choose one of: {' '.join(CHOICES[name])}")
    return CHOICES[name][value]


# ------------------------------------------------------------------------------------------------------------------
# Hydra quoting
# ------------------------------------------------------------------------------------------------------------------
def hydra_str(s: str) -> str:
    """`s` as a single-quoted Hydra value that composes to exactly `s` (a string, never interpolated).

    Two escapes, per Hydra 1.3's quoted-value grammar and OmegaConf 2.3's interpolation grammar: k backslashes before
    a quote or the closing quote become 2k (plus a backslash for the quote itself); k backslashes before `${` become
    2k+1.
    """
    out, bs = [], ""
    for i, c in enumerate(s):
        if c == "\\":
            bs += c
            continue
        if c == "'":
            out.append(bs + bs + "\\'")
        elif c == "$" and s[i + 1 : i + 2] == "{":
            out.append(bs + bs + "\\$")
        else:
            out.append(bs + c)
        bs = ""
    return "'" + "".join(out) + bs + bs + "'"


def hydra_files(value: str) -> str:
    """A Hydra list of the paths in `value`, one per line (a path may hold spaces); `value` as is if it is a list."""
    if value.startswith("["):
        return value
    return "[" + ",".join(hydra_str(f) for f in value.split("\n") if f) + "]"


# ------------------------------------------------------------------------------------------------------------------
# Knob values → command
# ------------------------------------------------------------------------------------------------------------------
def _whole(knobs: Dict[str, str], name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise KnobError(f"{name}='{value}' is not valid: give a whole number") from None


def build_overrides(knobs: Dict[str, str], repo: str, script: str) -> List[str]:
    """The Hydra overrides of the knob values `knobs` (name → value; a missing or empty name takes its default)."""

    def get(name: str, default: str = "") -> str:
        return knobs.get(name) or default

    ctx = _whole(knobs, "CTX", get("CTX", "2"))
    prompt = _whole(knobs, "PROMPT_LEN", get("PROMPT_LEN", str(ctx * 1024)))
    response = _whole(knobs, "RESPONSE_LEN", get("RESPONSE_LEN", str(ctx * 1024)))
    token_len = _whole(knobs, "TOKEN_LEN_FACTOR", get("TOKEN_LEN_FACTOR", "1")) * (prompt + response)
    project = get("PROJECT_NAME", "rpg-verl")
    exp_name = get("EXP_NAME", script)
    data_dir = get("DATA_DIR", f"{repo}/data")
    test_files = get("TEST_FILE") or "\n".join(f"{data_dir}/{v}.parquet" for v in get("VAL_SETS").split())
    loss_mode, reference = get("LOSS_MODE", "vanilla"), get("REFERENCE")
    if get("THINKING") and not get("ENABLE_THINKING"):
        raise KnobError(
            f"THINKING='{knobs['THINKING']}' is a knob of the Qwen3-4B scripts only (setup_qwen3_4b); unset it for "
            "this script (for another model with a thinking mode: the override "
            "+data.apply_chat_template_kwargs.enable_thinking=true)"
        )
    common = [
        # data (docs/differences.md#s7-2, #s7-5): files, context length
        f"data.train_files={hydra_files(get('TRAIN_FILE', f'{data_dir}/dapo-math-17k-eng.parquet'))}",
        f"data.val_files={hydra_files(test_files)}",
        f"data.max_prompt_length={prompt}",
        f"data.max_response_length={response}",
        # method: advantage estimator, dynamic sampling, loss, clip, verl's KL loss, lr
        f"algorithm.adv_estimator={get('ADV_ESTIMATOR', 'rpg')}",
        f"algorithm.filter_groups.enable={get('DYNAMIC_SAMPLING', 'True')}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
        f"actor_rollout_ref.actor.clip_ratio_low={get('CLIP_LOW', '0.2')}",
        f"actor_rollout_ref.actor.clip_ratio_high={get('CLIP_HIGH', '0.28')}",
        f"actor_rollout_ref.actor.use_kl_loss={get('USE_KL_LOSS', 'False')}",
        f"actor_rollout_ref.actor.kl_loss_type={get('KL_LOSS_TYPE', 'low_var_kl')}",
        f"actor_rollout_ref.actor.kl_loss_coef={get('KL_LOSS_COEF', '0.0')}",
        f"actor_rollout_ref.actor.optim.lr={get('LR', '1e-6')}",
        # token budgets of the dynamic batch size and of vLLM's batches, from the context (docs/differences.md#d14)
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={token_len}",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={token_len}",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={token_len}",
        f"actor_rollout_ref.model.path={hydra_str(get('MODEL_PATH', 'Qwen/Qwen3-4B'))}",
        f"actor_rollout_ref.rollout.max_num_batched_tokens={prompt + response}",
        # DAPO overlong penalty (docs/differences.md#s7-4): on/off, buffer = the last quarter of the response
        f"reward.reward_kwargs.overlong_buffer_cfg.enable={get('OVERLONG', 'True')}",
        f"reward.reward_kwargs.overlong_buffer_cfg.len={response // 4}",
        # names and cluster
        f"trainer.project_name={hydra_str(project)}",
        f"trainer.experiment_name={hydra_str(exp_name)}",
        f"trainer.nnodes={get('NNODES', '1')}",
        f"trainer.n_gpus_per_node={get('N_GPUS', '8')}",
        f"trainer.default_local_dir={hydra_str(get('CKPTS_DIR', f'{repo}/ckpts/{project}/{exp_name}'))}",
    ]
    # π_old and the trainer mode (docs/async.md#knobs): nothing passed at the defaults (recompute, sync)
    common += _choice(knobs, "OLD_LOGPROB") + _choice(knobs, "TRAINER_MODE")
    if get("GPU_MEMORY_UTILIZATION"):  # vLLM's memory pool (docs/gpu.md#memory-plan)
        common.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={get('GPU_MEMORY_UTILIZATION')}")
    if get("ENABLE_THINKING"):  # chat template of training and validation prompts (dataset and agent loop read it)
        common.append(f"+data.apply_chat_template_kwargs.enable_thinking={get('ENABLE_THINKING')}")
    if loss_mode.startswith("rpg_") or loss_mode == "grpo_wk3":
        common.append("actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig")
        # RPGPolicyLossConfig fields (new to verl's yaml: `+`), only when set: the defaults live in rpg/config.py
        names = ["KL_COEF", "REFERENCE"] + (["REF_REFRESH_STEPS", "REF_REFRESH_KL"] if reference == "periodic" else [])
        keys = {knob.name: knob.key for knob in KNOBS}
        common += [f"{keys[name]}={get(name)}" for name in names if get(name)]
    return common


def with_plugin(modules: str) -> str:
    """VERL_USE_EXTERNAL_MODULES with the plugin appended: every process (driver, TaskRunner, workers) imports it."""
    names = [m for m in modules.split(",") if m]
    return modules if PLUGIN_MODULE in names else ",".join(names + [PLUGIN_MODULE])


# ------------------------------------------------------------------------------------------------------------------
# Shell interface
# ------------------------------------------------------------------------------------------------------------------
def shell_defaults() -> str:
    """Assignments common.sh evaluates when sourced: every script knob at its default, and the list of knob names."""
    lines = [f"{k.name}={shlex.quote(k.default or '')}" for k in KNOBS if k.script]
    return "\n".join(lines + [f"RPG_KNOB_NAMES=({' '.join(KNOB_NAMES)})"]) + "\n"


def markdown() -> str:
    """The knob table of the READMEs (between `<!-- knobs -->` and `<!-- /knobs -->`)."""
    rows = ["| knob | default | sets | meaning |", "|---|---|---|---|"]
    for k in KNOBS:
        default = "(not passed)" if k.default is None else ("(empty)" if k.default == "" else f"`{k.default}`")
        key = f"`{k.key}`" if k.key else ""
        meaning = k.meaning.replace("|", "\\|")  # a literal | inside a table cell
        rows.append(f"| `{k.name}`{' (script)' if k.script else ''} | {default} | {key} | {meaning} |")
    return "\n".join(rows) + "\n"


def parse(argv: List[str]) -> dict:
    spec: dict = {"repo": "", "script": "rpg_run", "python": "python3", "knobs": {}, "profile": [], "optim": [],
                  "script_overrides": [], "job_env": [], "args": []}  # fmt: skip
    lists = {"--profile-override": "profile", "--optim-override": "optim", "--script-override": "script_overrides",
             "--job-env": "job_env"}  # fmt: skip
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--":
            spec["args"] = argv[i + 1 :]
            break
        if i + 1 >= len(argv):
            raise KnobError(f"recipe_argv: {flag} needs a value")
        value = argv[i + 1]
        if flag == "--knob":
            name, _, v = value.partition("=")
            spec["knobs"][name] = v
        elif flag in lists:
            spec[lists[flag]].append(value)
        elif flag in ("--repo", "--script", "--python"):
            spec[flag[2:]] = value
        else:
            raise KnobError(f"recipe_argv: unknown flag {flag!r}")
        i += 2
    return spec


def command(spec: dict) -> List[str]:
    overrides = build_overrides(spec["knobs"], spec["repo"], spec["script"])
    mode = spec["knobs"].get("TRAINER_MODE") or "sync"
    if mode != "sync" and any(o.startswith("trainer.v1.trainer_mode=") for o in spec["optim"]):
        raise KnobError(
            f"TRAINER_MODE='{mode}' with OPTIM=schedulefree: schedule-free AdamW runs in its own synchronous trainer "
            f"mode (schedule_free_sync), and there is no asynchronous one. Fix: unset TRAINER_MODE (sync), or use "
            f"OPTIM=adamw for {mode}"
        )
    return [spec["python"], "-m", "rpg.launch", *overrides, *spec["profile"], *spec["optim"],
            *spec["script_overrides"], *spec["args"]]  # fmt: skip


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--shell-defaults"]:
        sys.stdout.write(shell_defaults())
        return 0
    if argv[:1] == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    try:
        spec = parse(argv)
        cmd = command(spec)
    except KnobError as e:
        print(f"[rpg] error: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES=with_plugin(os.environ.get("VERL_USE_EXTERNAL_MODULES", "")))
    ray_address = env.get("RAY_ADDRESS", "")
    if env.get("RPG_PRINT_ARGV", "0") == "1":
        forwarded = {n: env[n] for n in FORWARDED_ENV if n in env}
        print(json.dumps({"argv": cmd, "ray_address": ray_address, "env": forwarded}))
        return 0
    if not ray_address:
        env["PYTHONPATH"] = spec["repo"] + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        sys.stdout.flush()
        os.execvpe(cmd[0], cmd, env)
    if __package__:
        from rpg.preflight import ray_submit
    else:  # run as a file: the sibling module, without importing the `rpg` package
        import ray_submit  # type: ignore[no-redef]
    names = [*FORWARDED_ENV, *spec["job_env"]]
    return ray_submit.submit(cmd, env, spec["repo"], spec["knobs"].get("EXP_NAME") or spec["script"], names)


if __name__ == "__main__":
    sys.exit(main())
