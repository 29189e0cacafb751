"""Bad launch inputs are refused before Ray starts (README, "Checked before launch"): local paths, context length, run
names, data sources and ground truths, and path knobs that carry spaces or shell/Hydra metacharacters through
`recipe/rpg/common.sh`.

Path problems (a local path that does not exist) are reported by a dry run and refused by a real launch; every other
problem here is refused by both. Rules are tested on the config one recipe script composes (print mode + in-process
Hydra compose); a few real `RPG_DRY_RUN=1 bash <script>` runs cover the shell → `python -m rpg.launch` path.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from omegaconf import OmegaConf, open_dict
from recipe_helpers import RECIPE, clean_env, overrides, run_script

from rpg.launch import RecipeConfigError, check_paths, compose_config, validate, validate_recipe

SCRIPT = RECIPE / "4b" / "run_rpg_reinforce_urkl_2k.sh"
HUB_MODEL = "Qwen/Qwen3-4B"


@pytest.fixture(scope="module")
def base():
    return compose_config(overrides(SCRIPT))


def cfg_with(base, **updates):
    """A copy of `base` with dotted keys set (new keys allowed)."""
    cfg = copy.deepcopy(base)
    with open_dict(cfg):
        for key, value in updates.items():
            OmegaConf.update(cfg, key, value, force_add=True, merge=False)
    return cfg


def write_parquet(path: Path, sources: list, truths: list, gt_type=pa.string()) -> str:
    table = pa.table(
        {
            "data_source": pa.array(sources, pa.string()),
            "prompt": pa.array([[{"role": "user", "content": "1+1?"}]] * len(sources)),
            "reward_model": pa.array(
                [{"style": "rule", "ground_truth": g} for g in truths],
                pa.struct([("style", pa.string()), ("ground_truth", gt_type)]),
            ),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return str(path)


@pytest.fixture
def data(tmp_path):
    """Existing train/val parquet files every source of which has a scorer."""
    train = write_parquet(tmp_path / "data" / "train.parquet", ["math_dapo"] * 3, ["1", "2", "3"])
    val = write_parquet(tmp_path / "data" / "aime-2024.parquet", ["aime-2024"] * 2, ["4", "5"])
    return {"data.train_files": [train], "data.val_files": [val]}


def refusal(cfg) -> str:
    with pytest.raises(RecipeConfigError) as info:
        validate_recipe(cfg)
    return str(info.value)


# --------------------------------------------------------------------------------------------------------------
# 1. Local paths that do not exist
# --------------------------------------------------------------------------------------------------------------
def test_existing_inputs_and_hub_ids_raise_nothing(base, data, tmp_path):
    (tmp_path / "model").mkdir()
    for model in (HUB_MODEL, "gpt2", "some-org/not-downloaded", str(tmp_path / "model")):
        assert check_paths(cfg_with(base, **data, **{"actor_rollout_ref.model.path": model})) == []


@pytest.mark.parametrize(
    "key, knob, value",
    [
        ("actor_rollout_ref.model.path", "MODEL_PATH", "/nonexistent/models/Qwen3-4B"),
        ("actor_rollout_ref.model.path", "MODEL_PATH", "./models/qwen"),  # not a hub id: `./` (as transformers)
        ("actor_rollout_ref.model.path", "MODEL_PATH", "~/models/qwen"),  # nobody expands ~ after the shell
        ("data.train_files", "TRAIN_FILE", ["/nonexistent/train.parquet"]),
        ("data.val_files", "TEST_FILE", ["/nonexistent/aime-2024.parquet"]),
    ],
)
def test_missing_local_path_is_named_with_key_and_knob(base, data, key, knob, value):
    problems = check_paths(cfg_with(base, **(data | {key: value})))
    assert len(problems) == 1, problems
    missing = value[0] if isinstance(value, list) else value
    assert key in problems[0] and knob in problems[0] and repr(missing) in problems[0], problems[0]
    assert "does not exist" in problems[0]


def test_each_missing_test_file_is_named(base, data, tmp_path):
    val = data["data.val_files"] + [str(tmp_path / "no-1.parquet"), str(tmp_path / "no-2.parquet")]
    (problem,) = check_paths(cfg_with(base, **(data | {"data.val_files": val})))
    assert "no-1.parquet" in problem and "no-2.parquet" in problem and "aime-2024.parquet" not in problem


def test_space_separated_test_files_get_a_hint(base, data, tmp_path):
    """TEST_FILE="a.parquet b.parquet" (the old form) is now one path; the report says how to give several."""
    a, b = data["data.train_files"][0], data["data.val_files"][0]
    (problem,) = check_paths(cfg_with(base, **(data | {"data.val_files": [f"{a} {b}"]})))
    assert "one per line" in problem and "Hydra list" in problem


def test_urls_and_globs(base, data, tmp_path):
    for url in ("hdfs://ns/data/train.parquet", "s3://bucket/train.parquet"):
        assert check_paths(cfg_with(base, **(data | {"data.train_files": [url]}))) == []
    assert check_paths(cfg_with(base, **(data | {"actor_rollout_ref.model.path": "hdfs://ns/models/q"}))) == []
    glob = str(tmp_path / "data" / "*.parquet")
    assert check_paths(cfg_with(base, **(data | {"data.train_files": [glob]}))) == []
    (problem,) = check_paths(cfg_with(base, **(data | {"data.train_files": [str(tmp_path / "none" / "*.parquet")]})))
    assert "matches no file" in problem


def test_resume_path(base, data, tmp_path):
    resume = {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": str(tmp_path / "ckpt/global_step_20")}
    (problem,) = check_paths(cfg_with(base, **data, **resume))
    assert "trainer.resume_from_path" in problem and "global_step_20" in problem
    (tmp_path / "ckpt" / "global_step_20").mkdir(parents=True)
    assert check_paths(cfg_with(base, **data, **resume)) == []
    validate_recipe(cfg_with(base, **data, **resume))


@pytest.mark.parametrize(
    "updates, needle",
    [
        ({"trainer.resume_mode": "resume"}, "choose one of: auto, disable, resume_path"),
        ({"trainer.resume_mode": "resume_path", "trainer.resume_from_path": None}, "resume_from_path=None"),
        ({"trainer.resume_mode": "resume_path", "trainer.resume_from_path": "/ckpts/latest"}, "global_step_<N>"),
    ],
)
def test_resume_settings_are_refused(base, data, updates, needle):
    assert needle in refusal(cfg_with(base, **data, **updates))


def test_dry_run_reports_and_real_launch_refuses(base, data, monkeypatch, capsys):
    """`run`: a real launch raises before verl's run_ppo; a dry run prints the YAML and the report on stderr."""
    import verl.trainer.main_ppo as main_ppo

    def must_not_start(*args, **kwargs):
        raise AssertionError("the trainer was started")

    monkeypatch.setattr(main_ppo, "run_ppo", must_not_start)
    from rpg.launch import run

    cfg = cfg_with(base, **(data | {"data.train_files": ["/nonexistent/train.parquet"]}))
    monkeypatch.delenv("RPG_DRY_RUN", raising=False)
    with pytest.raises(RecipeConfigError, match=r"data\.train_files.*'/nonexistent/train\.parquet' does not exist"):
        run(copy.deepcopy(cfg))
    monkeypatch.setenv("RPG_DRY_RUN", "1")
    run(copy.deepcopy(cfg))
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["data"]["train_files"] == ["/nonexistent/train.parquet"]
    assert "a real launch would refuse" in err and "/nonexistent/train.parquet" in err


def test_an_incomplete_checkpoint_is_refused_before_the_trainer_starts(base, data, tmp_path, monkeypatch, capsys):
    """The launcher's resume hook (rpg/preflight/resume_ckpt.py; its rules: tests/preflight/test_resume_ckpt_on_cpu.py):
    resume_mode=auto over a latest checkpoint that lacks one rank's extra state is refused before verl's run_ppo."""
    import rpg.launch
    import verl.trainer.main_ppo as main_ppo

    monkeypatch.setattr(main_ppo, "run_ppo", lambda *a, **k: pytest.fail("the trainer was started"))
    monkeypatch.setattr(rpg.launch, "check_gpu_launch", lambda *a, **k: None)  # no GPU on this machine
    monkeypatch.setattr(rpg.launch, "disk_problem", lambda *a, **k: None)
    monkeypatch.delenv("RPG_DRY_RUN", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")  # the wandb check comes first (tests/recipes/test_wandb_check_on_cpu.py)
    ckpts, ranks = tmp_path / "ckpts", base.trainer.n_gpus_per_node * base.trainer.nnodes
    for step in (1, 2):
        for rel in ["data.pt"] + [f"actor/{kind}_world_size_{ranks}_rank_{r}.pt" for r in range(ranks)
                                  for kind in ("model", "optim", "extra_state")]:  # fmt: skip
            (ckpts / f"global_step_{step}" / rel).parent.mkdir(parents=True, exist_ok=True)
            (ckpts / f"global_step_{step}" / rel).write_bytes(b"x")
    (ckpts / "latest_checkpointed_iteration.txt").write_text("2")
    (ckpts / f"global_step_2/actor/extra_state_world_size_{ranks}_rank_{ranks - 1}.pt").unlink()
    cfg = cfg_with(base, **data, **{"trainer.resume_mode": "auto", "trainer.default_local_dir": str(ckpts)})
    with pytest.raises(RecipeConfigError, match=rf"lacks actor/extra_state_world_size_{ranks}_rank_{ranks - 1}\.pt.*"
                                                rf"trainer\.resume_from_path={ckpts}/global_step_1"):  # fmt: skip
        rpg.launch.run(copy.deepcopy(cfg))
    capsys.readouterr()
    monkeypatch.setenv("RPG_DRY_RUN", "summary")  # a dry run lists it among the summary's refusals
    rpg.launch.run(cfg)
    summary = capsys.readouterr().out
    assert f"lacks actor/extra_state_world_size_{ranks}_rank_{ranks - 1}.pt" in summary, summary


def test_validate_returns_the_path_problems(base, data):
    cfg = cfg_with(base, **(data | {"data.train_files": ["/nonexistent/train.parquet"]}))
    assert any("/nonexistent/train.parquet" in p for p in validate(cfg).path_problems)
    with pytest.raises(RecipeConfigError, match="/nonexistent/train.parquet"):
        validate(cfg, real_launch=True)


# --------------------------------------------------------------------------------------------------------------
# 2. Context length vs the model's max_position_embeddings
# --------------------------------------------------------------------------------------------------------------
def model_dir(path: Path, **config) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", **config}))
    return str(path)


def lengths(prompt: int, response: int) -> dict:
    return {
        "data.max_prompt_length": prompt,
        "data.max_response_length": response,
        "reward.reward_kwargs.max_resp_len": response,
        "reward.reward_kwargs.overlong_buffer_cfg.len": response // 4,
    }


def test_context_beyond_a_local_model_is_refused(base, data, tmp_path):
    model = {"actor_rollout_ref.model.path": model_dir(tmp_path / "m", max_position_embeddings=4096)}
    message = refusal(cfg_with(base, **data, **model, **lengths(2048, 4096)))
    assert "2048 + 4096 = 6144" in message and "max_position_embeddings=4096" in message
    assert "data.max_prompt_length" in message and "data.max_response_length" in message and "recipe.ctx" in message
    validate_recipe(cfg_with(base, **data, **model, **lengths(2048, 2048)))  # exactly the limit is fine


def test_context_check_reads_override_config_and_skips_rope_scaling(base, data, tmp_path):
    model = {"actor_rollout_ref.model.path": model_dir(tmp_path / "m", max_position_embeddings=4096)}
    longer = {"actor_rollout_ref.model.override_config.max_position_embeddings": 8192}
    validate_recipe(cfg_with(base, **data, **model, **longer, **lengths(4096, 4096)))
    yarn = model_dir(tmp_path / "yarn", max_position_embeddings=4096, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    validate_recipe(cfg_with(base, **data, **{"actor_rollout_ref.model.path": yarn}, **lengths(4096, 4096)))


def test_context_check_uses_a_cached_hub_config_never_the_network(base, data, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = cfg_with(base, **data, **{"actor_rollout_ref.model.path": "org/long-ctx-model"}, **lengths(4096, 4096))
    validate_recipe(cfg)  # not in the cache: not checked (and nothing is downloaded)
    snapshot = tmp_path / "hub" / "models--org--long-ctx-model"
    model_dir(snapshot / "snapshots" / "abc123", max_position_embeddings=4096)
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text("abc123")
    assert "4096 + 4096 = 8192" in refusal(cfg)


# --------------------------------------------------------------------------------------------------------------
# 4. Run names that escape the checkpoint root
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, knob, name",
    [
        ("trainer.experiment_name", "EXP_NAME", ".."),
        ("trainer.experiment_name", "EXP_NAME", "../other-run"),
        ("trainer.experiment_name", "EXP_NAME", "a/b"),
        ("trainer.project_name", "PROJECT_NAME", "/tmp"),
        ("trainer.project_name", "PROJECT_NAME", "."),
        ("trainer.project_name", "PROJECT_NAME", ""),
    ],
)
def test_run_names_must_be_one_path_component(base, data, key, knob, name):
    message = refusal(cfg_with(base, **data, **{key: name}))
    assert f"{key}={name!r}" in message and knob in message and "one path component" in message


def test_ordinary_run_names_pass(base, data):
    validate_recipe(cfg_with(base, **data, **{"trainer.experiment_name": "rpg..v2 (β=1e-4), run #3"}))


# --------------------------------------------------------------------------------------------------------------
# 5. Every data_source has a scorer; 6. every ground truth can be scored (checked at launch)
# --------------------------------------------------------------------------------------------------------------
def test_unscored_data_source_is_refused_at_launch(base, data, tmp_path):
    bad = write_parquet(tmp_path / "data" / "minerva.parquet", ["math-dapo", "aime-2024", "math-dapo"], ["1"] * 3)
    message = refusal(cfg_with(base, **(data | {"data.val_files": data["data.val_files"] + [bad]})))
    assert "data.val_files" in message and "TEST_FILE" in message and "minerva.parquet" in message
    assert "data_source 'math-dapo' (2 rows)" in message and "'aime-2024'" not in message


def test_null_data_source_is_refused_at_launch(base, data, tmp_path):
    bad = write_parquet(tmp_path / "data" / "t.parquet", ["math_dapo", None, None], ["1"] * 3)
    message = refusal(cfg_with(base, **(data | {"data.train_files": [bad]})))
    assert "TRAIN_FILE" in message and "2 rows have no data_source" in message


def test_verl_default_scorer_is_probed_when_no_custom_function(base, data, tmp_path):
    """Without rpg's compute_score, verl's own routing decides: it cannot score amc_23 (rpg can)."""
    amc = write_parquet(tmp_path / "data" / "amc.parquet", ["amc_23"], ["1"])
    cfg = cfg_with(base, **(data | {"data.val_files": [amc]}))
    validate_recipe(cfg)  # rpg.data.reward routes amc* to math_dapo
    cfg = cfg_with(cfg, **{"reward.custom_reward_function.path": None})
    assert "data_source 'amc_23'" in refusal(cfg) and "default_compute_score" in refusal(cfg)


def test_a_users_own_score_function_is_not_second_guessed(base, data, tmp_path):
    odd = write_parquet(tmp_path / "data" / "odd.parquet", ["my-own-source"], ["1"])
    own = tmp_path / "my_reward.py"
    own.write_text("def score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0.0\n")
    fn = {"reward.custom_reward_function.path": str(own), "reward.custom_reward_function.name": "score"}
    cfg = cfg_with(base, **(data | {"data.val_files": [odd]} | fn))
    validate_recipe(cfg)


@pytest.mark.parametrize(
    "gt_type, truths, needle",
    [
        (pa.bool_(), [True], "True (bool)"),
        (pa.list_(pa.string()), [["1", "2"]], "2 elements"),
        (pa.string(), ["1", None], "None"),
    ],
    ids=["bool", "two-answers", "null"],
)
def test_unscorable_ground_truth_is_refused_at_launch(base, data, tmp_path, gt_type, truths, needle):
    bad = write_parquet(tmp_path / "data" / "t.parquet", ["math_dapo"] * len(truths), truths, gt_type)
    message = refusal(cfg_with(base, **(data | {"data.train_files": [bad]})))
    assert "TRAIN_FILE" in message and "reward_model.ground_truth" in message and needle in message


def test_numeric_ground_truths_pass_at_launch(base, data, tmp_path):
    ints = write_parquet(tmp_path / "data" / "i.parquet", ["math_dapo"] * 2, [5, 7], pa.int64())
    lists = write_parquet(tmp_path / "data" / "l.parquet", ["aime"] * 2, [["5"], ["7"]], pa.list_(pa.string()))
    validate_recipe(cfg_with(base, **(data | {"data.train_files": [ints, lists]})))


def test_missing_files_are_left_to_the_path_report(base, data):
    validate_recipe(cfg_with(base, **(data | {"data.train_files": ["/nonexistent/train.parquet"]})))


# --------------------------------------------------------------------------------------------------------------
# 3. Path knobs survive spaces and shell/Hydra metacharacters (recipe/rpg/common.sh → Hydra → config)
# --------------------------------------------------------------------------------------------------------------
NASTY = [
    "/data/my runs/train.parquet",
    "/d/a,b/[x]/{y}/(z)/k=v:w@h.parquet",
    "/d/it's/\"q\"/t.parquet",
    "/d/$HOME/${HOME}/${oc.env:HOME}/$(id)/`id`/t.parquet",
    "/d/back\\slash/\\'/\\\\${HOME}/\\${x}/t\\",
    "/d/\ttab/#h/!b/&|;<>*?~/%s/t.parquet",
    "/d/ünï 🙂/t.parquet",
    " lead and trail ",
    "123",
    "null",
]


def printed_overrides(**env) -> list[str]:
    proc = run_script(SCRIPT, RPG_PRINT_ARGV="1", **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["argv"][3:]


@pytest.mark.parametrize("path", NASTY, ids=repr)
def test_path_knobs_compose_to_the_exact_value(path):
    env = {"TRAIN_FILE": path, "TEST_FILE": f"{path}\n{path}.2", "MODEL_PATH": path, "CKPTS_DIR": path}
    cfg = compose_config(printed_overrides(**env))
    assert list(cfg.data.train_files) == [path]
    assert list(cfg.data.val_files) == [path, path + ".2"]
    assert cfg.actor_rollout_ref.model.path == path
    assert cfg.trainer.default_local_dir == path


def test_data_dir_and_run_names_compose_to_the_exact_value():
    d, name = "/data/it's a [dir], ${HOME}", "run, (β=1e-4) 'quoted' ${x}"
    cfg = compose_config(printed_overrides(DATA_DIR=d, EXP_NAME=name, PROJECT_NAME=name))
    assert list(cfg.data.train_files) == [f"{d}/dapo-math-17k-eng.parquet"]
    assert list(cfg.data.val_files) == [f"{d}/{s}.parquet" for s in ("aime-2024", "aime-2025", "amc-2023")]
    assert cfg.trainer.experiment_name == cfg.trainer.project_name == name
    assert cfg.trainer.default_local_dir.endswith(f"/ckpts/{name}/{name}")


def test_test_file_forms():
    """TEST_FILE: one path (spaces are part of it), one path per line, or a Hydra list (verl's own convention)."""
    one = compose_config(printed_overrides(TEST_FILE="/a b/c d.parquet"))
    assert list(one.data.val_files) == ["/a b/c d.parquet"]
    lines = compose_config(printed_overrides(TEST_FILE="/a b.parquet\n\n/c.parquet\n"))
    assert list(lines.data.val_files) == ["/a b.parquet", "/c.parquet"]
    hydra_list = compose_config(printed_overrides(TEST_FILE="['/a b.parquet','/c.parquet']"))
    assert list(hydra_list.data.val_files) == ["/a b.parquet", "/c.parquet"]


def test_real_dry_run_keeps_nasty_paths_and_reports_them(tmp_path):
    """`RPG_DRY_RUN=1 bash <script>` end to end: exit 0, the YAML holds the exact paths, stderr reports them."""
    train, test, model = NASTY[0], NASTY[3], NASTY[1]
    env = clean_env(RPG_DRY_RUN="1", PYTHON=sys.executable, TRAIN_FILE=train, TEST_FILE=f"{test}\n{NASTY[2]}", MODEL_PATH=model)
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["data"]["train_files"] == [train] and cfg["data"]["val_files"] == [test, NASTY[2]]
    assert cfg["actor_rollout_ref"]["model"]["path"] == model
    for path in (train, test, NASTY[2], model):
        assert repr(path) in proc.stderr, path
    assert "a real launch would refuse" in proc.stderr


def test_every_recipe_dry_run_reports_missing_data_without_failing(tmp_path, monkeypatch, capsys):
    """The recipes' default data files do not exist here: a dry run reports them and still succeeds (the other 87
    scripts take the same in-process path in test_dry_run_on_cpu.py). `RPG_DRY_RUN=1 bash run_dapo_7b.sh` in-process
    through `rpg.launch.main` (Hydra's entry, with the script's argv for that DATA_DIR); the shell path itself runs
    in the real dry run above."""
    from rpg import launch

    proc = run_script(RECIPE / "7b" / "run_dapo_7b.sh", RPG_PRINT_ARGV="1", DATA_DIR=str(tmp_path / "no-data"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.setattr(sys, "argv", ["rpg.launch"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RPG_DRY_RUN", "1")
    for name in ("RAY_ADDRESS", "SMOKE"):
        monkeypatch.delenv(name, raising=False)
    launch.main(json.loads(proc.stdout)["argv"][3:])  # a refusal is a SystemExit: the test fails
    out, err = capsys.readouterr()
    assert "data.train_files (recipe knob TRAIN_FILE)" in err
    assert "amc-2023.parquet" in err and yaml.safe_load(out)["trainer"]["total_training_steps"] == 400


def test_files_without_the_reward_columns_are_refused(base, data, tmp_path):
    no_source = tmp_path / "data" / "no_source.parquet"
    pq.write_table(pa.table({"reward_model": [{"ground_truth": "1"}]}), no_source)
    no_truth = tmp_path / "data" / "no_truth.parquet"
    pq.write_table(pa.table({"data_source": ["math_dapo"], "reward_model": [{"style": "rule"}]}), no_truth)
    message = refusal(cfg_with(base, **(data | {"data.train_files": [str(no_source), str(no_truth)]})))
    assert "no_source.parquet: no data_source column" in message
    assert "no_truth.parquet: no reward_model.ground_truth column" in message
