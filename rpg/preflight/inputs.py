"""Launch inputs: local paths (model, data files, resume path), the context length against the model, and a scorer for
every data source and ground truth of the local data files. Messages name the recipe knob that sets each key."""

from __future__ import annotations

import collections
import glob
import json
import os
import re
from typing import Callable, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from rpg.data import reward


#: The recipe knob (environment variable of recipe/rpg/common.sh) that sets a key; messages name both.
RECIPE_KNOBS = {
    "actor_rollout_ref.model.path": "MODEL_PATH",
    "data.train_files": "TRAIN_FILE",
    "data.val_files": "TEST_FILE",
    "data.max_prompt_length": "the setup's context, recipe.ctx",
    "data.max_response_length": "the setup's context, recipe.ctx",
    "trainer.project_name": "PROJECT_NAME",
    "trainer.experiment_name": "EXP_NAME",
    "data.apply_chat_template_kwargs.enable_thinking": "THINKING, Qwen3-4B setups",
}
RESUME_MODES = ("auto", "disable", "resume_path")  # verl 0.9.1 `_load_checkpoint`
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # hdfs://, s3://, hf://...: fetched by verl or fsspec, not checked


def _knob(key: str) -> str:
    return f" (recipe knob {RECIPE_KNOBS[key]})" if key in RECIPE_KNOBS else ""


def _paths(config: DictConfig, key: str) -> list[str]:
    """The path or paths at `key` (verl takes one or a list)."""
    value = OmegaConf.select(config, key)
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, ListConfig | list | tuple) else [str(value)]


def _local_files(path: str) -> Optional[list[str]]:
    """The local files `path` names: itself if it exists, else the matches of a glob (`datasets` expands data-file
    globs); None for a URL."""
    if _URL.match(path):
        return None
    if os.path.exists(path):
        return [path]
    return sorted(glob.glob(path)) if glob.has_magic(path) else []


def _model_location(path: str) -> str:
    """'local', 'hub', 'url' or 'missing', decided as transformers decides (`transformers.utils.hub.cached_files`):
    an existing directory is a local model; anything else is read as a hub repo id, which must pass huggingface_hub's
    `validate_repo_id` (`Qwen/Qwen3-4B` does, `/models/x`, `./x` and `~/x` do not: those are local paths)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if _URL.match(path):
        return "url"
    if os.path.isdir(path):
        return "local"
    try:
        validate_repo_id(path)
    except HFValidationError:
        return "missing"
    return "hub"


def _rule_model_path(config: DictConfig) -> Optional[str]:
    key = "actor_rollout_ref.model.path"
    path = str(OmegaConf.select(config, key))
    if _model_location(path) != "missing":
        return None
    tilde = " (nothing expands `~` after the shell: write the full path)" if path.startswith("~") else ""
    return (
        f"{key}={path!r}{_knob(key)} does not exist: it is no local directory, and not a Hugging Face hub id "
        f"either{tilde}. Fix: point MODEL_PATH at the model directory (with its config.json) or give a hub id such "
        f"as Qwen/Qwen3-4B."
    )


def _missing_data_files(config: DictConfig, key: str) -> Optional[str]:
    missing = [p for p in _paths(config, key) if _local_files(p) == []]
    if not missing:
        return None
    listed = ", ".join(f"{p!r} {'matches no file' if glob.has_magic(p) else 'does not exist'}" for p in missing)
    several = (
        " A value with spaces is one path: give several files one per line, or as a Hydra list "
        "\"['a.parquet','b.parquet']\"."
        if any(" " in p for p in missing)
        else ""
    )
    return (
        f"{key}{_knob(key)}: {listed}. Fix: point {RECIPE_KNOBS[key]} at existing parquet files (the recipes "
        f"default to DATA_DIR/<name>.parquet).{several}"
    )


def _rule_train_files(config: DictConfig) -> Optional[str]:
    return _missing_data_files(config, "data.train_files")


def _rule_val_files(config: DictConfig) -> Optional[str]:
    return _missing_data_files(config, "data.val_files")


def _rule_resume_path_exists(config: DictConfig) -> Optional[str]:
    path = config.trainer.get("resume_from_path", None)
    if config.trainer.resume_mode != "resume_path" or path is None or _local_files(str(path)) != []:
        return None
    return (
        f"trainer.resume_from_path={str(path)!r} does not exist (trainer.resume_mode=resume_path). Fix: give an "
        f"existing checkpoint directory .../global_step_<N>, or trainer.resume_mode=auto to resume from the latest "
        f"one under trainer.default_local_dir."
    )


#: Local paths that must exist: a dry run reports a missing one, a real launch refuses it.
PATH_RULES: tuple[Callable[[DictConfig], Optional[str]], ...] = (
    _rule_model_path,
    _rule_train_files,
    _rule_val_files,
    _rule_resume_path_exists,
)


def check_paths(config: DictConfig) -> list[str]:
    """The PATH_RULES violations: local paths (model, each train/val file, resume path) that do not exist."""
    return [msg for rule in PATH_RULES if (msg := rule(config))]


def _model_config_file(path: str) -> Optional[str]:
    """config.json of a local model, or of a hub model already in the local Hugging Face cache (never downloads)."""
    location = _model_location(path)
    if location == "local":
        file = os.path.join(path, "config.json")
        return file if os.path.isfile(file) else None
    if location == "hub":
        from huggingface_hub import try_to_load_from_cache

        file = try_to_load_from_cache(path, "config.json")
        return file if isinstance(file, str) else None
    return None


def _rule_context_fits_model(config: DictConfig) -> Optional[str]:
    model = config.actor_rollout_ref.model
    file = _model_config_file(str(model.get("hf_config_path", None) or model.path))
    if file is None:
        return None
    with open(file) as f:
        hf = json.load(f)
    hf.update(OmegaConf.to_container(model.get("override_config", None) or OmegaConf.create(), resolve=True))
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return None  # scaled RoPE: the inference engine derives the usable length by its own rules
    limit = hf.get("max_position_embeddings") or (hf.get("text_config") or {}).get("max_position_embeddings")
    prompt, response = config.data.max_prompt_length, config.data.max_response_length
    if not isinstance(limit, int) or prompt + response <= limit:
        return None
    return (
        f"data.max_prompt_length{_knob('data.max_prompt_length')} + data.max_response_length"
        f"{_knob('data.max_response_length')} = {prompt} + {response} = {prompt + response} exceeds the model's "
        f"max_position_embeddings={limit} ({file}). Fix: lower them to at most {limit} in total, or use a model "
        f"with a longer context."
    )


def _configured_scorer(config: DictConfig):
    """(name, has_scorer, owns_ground_truths) of the score function the reward manager will call, or None when it is
    a user's own function (not second-guessed) or a custom reward manager."""
    if config.reward.reward_manager.get("source", "register") != "register":
        return None
    fn = config.reward.get("custom_reward_function", None) or {}
    if not fn.get("path"):
        return "verl's default_compute_score", reward.verl_has_scorer, False
    from verl.utils.import_utils import load_extern_object

    try:
        obj = load_extern_object(module_path=fn.path, object_name=fn.name)
    except Exception:  # noqa: BLE001 -- _rule_custom_reward_fn reports it
        return None
    return (f"{fn.path}:{fn.name}", reward.has_scorer, True) if obj is reward.compute_score else None


def _scoring_problems(file: str, scorer) -> list[str]:
    """What the reward manager would fail on in a parquet file: rows without a data_source, sources without a scorer,
    and (for rpg's compute_score) ground truths its scorers cannot read. Reads two columns only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name, has_scorer, owns_ground_truths = scorer
    try:
        parquet = pq.ParquetFile(file)
        schema = parquet.schema_arrow
        if "data_source" not in schema.names:
            return [f"{file}: no data_source column (it selects each row's scorer)"]
        sources = parquet.read(columns=["data_source"]).column(0).to_pylist()
        truths = None
        rm = schema.field("reward_model").type if "reward_model" in schema.names else None
        if rm is not None and pa.types.is_struct(rm) and rm.get_field_index("ground_truth") >= 0:
            rows = parquet.read(columns=["reward_model.ground_truth"]).column(0).to_pylist()
            truths = [(row or {}).get("ground_truth") for row in rows]
    except Exception as e:  # noqa: BLE001 -- unreadable file: report it with the reader's message
        return [f"{file}: cannot be read as parquet ({type(e).__name__}: {e})"]
    problems = []
    counts = collections.Counter(sources)
    if nulls := counts.pop(None, 0):
        problems.append(f"{file}: {nulls} rows have no data_source (null); every row needs one, it selects the scorer")
    for source, n in sorted(counts.items(), key=str):
        if not (isinstance(source, str) and has_scorer(source)):
            problems.append(
                f"{file}: data_source {source!r} ({n} rows) has no scorer in {name}; it scores "
                f"{', '.join(reward.own_sources()) + ' and ' if owns_ground_truths else ''}the sources of verl's "
                f"default_compute_score (verl/utils/reward_score/__init__.py). Fix: rename the source in the data, or "
                f"set reward.custom_reward_function to a function that scores it."
            )
    if not owns_ground_truths:
        return problems
    if truths is None:
        return problems + [f"{file}: no reward_model.ground_truth column (the reward manager reads it)"]
    bad = []
    for row, (source, truth) in enumerate(zip(sources, truths, strict=True)):
        if isinstance(source, str) and reward.scorer_for(source) is not None:
            try:
                reward.ground_truth_text(truth)
            except ValueError as e:
                bad.append((row, e))
    if bad:
        row, error = bad[0]
        problems.append(f"{file}: row {row} reward_model.ground_truth: {error} ({len(bad)} rows like this)")
    return problems


def _rule_data_sources_scored(config: DictConfig) -> Optional[str]:
    scorer = _configured_scorer(config)
    if scorer is None:
        return None
    problems = []
    for key in ("data.train_files", "data.val_files"):
        for path in _paths(config, key):
            for file in _local_files(path) or []:  # missing files: PATH_RULES
                if file.endswith(".parquet") and os.path.isfile(file):
                    problems += [f"{key}{_knob(key)}: {p}" for p in _scoring_problems(file, scorer)]
    return "\n- ".join(problems) or None
