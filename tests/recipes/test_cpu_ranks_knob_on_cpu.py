"""CPU_RANKS (the CPU profile, rpg/preflight/recipe_argv.py `cpu_profile`): N FSDP ranks on CPU, the analogue of
N_GPUS; bad values refused up front.

The launcher's print mode (RPG_PRINT_ARGV=1, no Python start) shows the final overrides: CPU_RANKS=N sets verl's
`trainer.n_gpus_per_node=N`, asks Ray for N fake GPUs (local runs only: with RAY_ADDRESS the cluster provides its
resources and Ray refuses ray_init ones) and divides the per-rank micro-batch sizes by N; the composed config passes
the launcher's full validation. Values that are not a whole number ≥ 1, or that do not split the batch and the
mini-batch evenly, stop the script with exit code 2 and a message naming the setting, the value and the fix.
"""

from __future__ import annotations

import json

import pytest
from recipe_helpers import RECIPE, run_script

SCRIPT = RECIPE / "cpu" / "run_rpg_reinforce_urkl.sh"


def final(argv: list[str]) -> dict[str, str]:
    """key -> value of the last override of each key (later overrides win), without a leading '+'."""
    out = {}
    for a in argv[3:]:
        key, _, value = a.partition("=")
        out[key.lstrip("+")] = value
    return out


def argv(**env: str) -> list[str]:
    proc = run_script(SCRIPT, RPG_PRINT_ARGV="1", **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["argv"]


@pytest.mark.parametrize("ranks", ["1", "2", "4"])
def test_cpu_ranks_sets_the_machine_and_per_rank_sizes(ranks):
    n = int(ranks)
    cfg = final(argv(CPU_RANKS=ranks, CPU_BATCH="8", CPU_MINI_BATCH="4", CPU_N="4"))
    assert cfg["trainer.n_gpus_per_node"] == ranks and cfg["trainer.nnodes"] == "1"
    assert cfg["ray_kwargs.ray_init.num_gpus"] == ranks and cfg["ray_kwargs.ray_init.num_cpus"] == "16"
    assert cfg["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == str(16 // n)
    assert cfg["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == str(32 // n)
    assert cfg["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == str(32 // n)


def test_two_ranks_compose_and_validate():
    from rpg.launch import compose_and_validate

    validated = compose_and_validate(argv(CPU_RANKS="2")[3:])
    assert validated.config.trainer.n_gpus_per_node == 2
    assert validated.config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1  # one rollout replica per rank


def test_with_a_ray_cluster_the_cluster_provides_the_resources():
    cfg = final(argv(CPU_RANKS="2", RAY_ADDRESS="http://127.0.0.1:8265"))
    assert cfg["trainer.n_gpus_per_node"] == "2"
    assert not any(k.startswith("ray_kwargs.ray_init.num_") for k in cfg), "Ray refuses resources when joining"


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two", " 2", ""])
def test_bad_cpu_ranks_is_refused(value):
    proc = run_script(SCRIPT, RPG_PRINT_ARGV="1", CPU_RANKS=value)
    if value == "":  # empty = unset: the default of 1 rank
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"CPU_RANKS='{value}' is not valid" in proc.stderr and "whole number" in proc.stderr


@pytest.mark.parametrize(
    "env, what",
    [
        ({"CPU_RANKS": "3", "CPU_BATCH": "6", "CPU_MINI_BATCH": "2", "CPU_N": "4"}, "mini-batch of"),
        ({"CPU_RANKS": "3", "CPU_BATCH": "4", "CPU_MINI_BATCH": "3", "CPU_N": "1"}, "batch of"),
        ({"CPU_RANKS": "2", "CPU_N": "0"}, "CPU_N='0' is not valid"),
    ],
)
def test_batches_that_do_not_split_over_the_ranks_are_refused(env, what):
    proc = run_script(SCRIPT, RPG_PRINT_ARGV="1", **env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert what in proc.stderr
    if "is not valid" not in what:
        assert f"CPU_RANKS={env['CPU_RANKS']} does not divide" in proc.stderr and "choose" in proc.stderr
