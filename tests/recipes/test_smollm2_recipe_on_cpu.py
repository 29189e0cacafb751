"""recipe/rpg/cpu/smollm2.sh (docs/benchmarks.md#real-model): the real-model wrapper passes the method's CPU script
this model and task, the micro-batches that fit, π_old from the rollout and no dynamic sampling, and the composed
config validates; a missing method is one line naming the choices. (SmolLM2 itself is not needed: MODEL_PATH and the
data point at the tiny model's files; the real-model run is the documented command, not a test.)"""

from __future__ import annotations

import json
import sys

from recipe_helpers import RECIPE, REPO, run_script

from rpg.tools import dry_run_digest as dd

SCRIPT = RECIPE / "cpu" / "smollm2.sh"


def printed(tiny_dir, method: str, **env: str) -> dict:
    """The launch the wrapper would make (RPG_PRINT_ARGV=1), with this environment's Python for its tools (so it does
    not run scripts/setup_env.sh)."""
    proc = run_script(SCRIPT, method, RPG_PRINT_ARGV="1", MODEL_PATH=str(tiny_dir / "model"),
                      TRAIN_FILE=str(tiny_dir / "train.parquet"), TEST_FILE=str(tiny_dir / "val.parquet"),
                      PYTHON_TOOLS=sys.executable, **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_wrapper_defaults_are_the_comparisons_settings(tiny_dir):
    """`bash recipe/rpg/cpu/smollm2.sh <method>` as typed is one run of the committed comparison (REAL_MODEL)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from e2e_cpu_runs import REAL_MODEL

    steps = {"CPU_STEPS": "20"}  # the comparison's --steps
    assert printed(tiny_dir, "grpo") == printed(tiny_dir, "grpo", **REAL_MODEL, **steps)
    assert printed(tiny_dir, "grpo") != printed(tiny_dir, "grpo", **dict(REAL_MODEL, CPU_LR="1e-5"), **steps)


def test_the_wrapper_passes_the_real_model_settings_after_the_profile(tiny_dir):
    overrides = dd.launch_overrides(printed(tiny_dir, "grpo"))
    assert f"actor_rollout_ref.model.path='{tiny_dir / 'model'}'" in overrides
    assert "method=grpo" in overrides and "profile=cpu" in overrides
    tail = overrides[overrides.index("data.max_prompt_length=48"):]  # after the profile's sizes: these win
    assert tail[:5] == ["data.max_prompt_length=48", "algorithm.filter_groups.enable=False",
                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
                        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16"]
    assert "data.max_response_length=48" in overrides
    assert "algorithm.rollout_correction.bypass_mode=True" in overrides  # OLD_LOGPROB=rollout


def test_the_composed_config_validates(tiny_dir):
    from rpg.launch import compose_config, validate

    cfg = compose_config(dd.launch_overrides(printed(tiny_dir, "rpg_reinforce_urkl")))
    validate(cfg)
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
    assert cfg.algorithm.filter_groups.enable is False
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "rpg_reinforce_urkl"


def test_a_missing_or_unknown_method_is_one_line():
    for args in ((), ("ppo",)):
        proc = run_script(SCRIPT, *args)
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("[rpg] error: smollm2.sh needs a method"), proc.stderr
        assert "rpg_reinforce_urkl" in lines[0] and "grpo" in lines[0]
