"""CPU platform (rpg/cpu/platform.py), fast-poll sampler (rpg/cpu/sampler.py) and progress filter (rpg/cpu/progress.py).

The platform checks run in fresh processes because the platform is a per-process singleton chosen at `import verl`:
the four of them forked from one interpreter that preloaded verl's third-party libraries (`fresh_process`; verl and
rpg never imported before a check starts), once for the module (the `fresh` fixture).
"""

import io
import json
import os
import subprocess

import fresh_process
import pytest
from omegaconf import OmegaConf

PLATFORM_PROBE = r"""
import json, os, torch
import verl
import verl.utils.distributed as vd
from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device
import verl.utils.fsdp_utils as fu
out = {"device": get_device_name(), "backend": get_nccl_backend(),
       "patched": hasattr(vd.initialize_global_process_group_ray, "__wrapped__")}
if out["device"] == "cpu":
    out["pin_memory"] = fu.CPUOffloadPolicy(pin_memory=True).pin_memory
    out["mem_allocated"] = get_torch_device().memory_allocated()
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(20000 + os.getpid() % 20000))
    vd.initialize_global_process_group_ray(timeout_second=60)  # verl's call in ActorRolloutRefWorker
    out["pg_backend"] = torch.distributed.get_backend()
    t = torch.ones(2)
    torch.distributed.all_reduce(t)
    out["all_reduce"] = t.tolist()
    from verl.workers.engine.base import EngineRegistry
    out["engine"] = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__
print("RESULT" + json.dumps(out))
"""


def _env(**update: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES",
                                                            "VERL_ENGINE_DEVICE")}
    return {**env, **update}


def _result(res: subprocess.CompletedProcess):
    lines = [l for l in res.stdout.splitlines() if l.startswith("RESULT")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT"):])


def test_cpu_platform_selected_by_env_and_shims_work(fresh):
    out = _result(fresh["cpu"])
    assert out == {"device": "cpu", "backend": "gloo", "patched": True, "pin_memory": False, "mem_allocated": 0,
                   "pg_backend": "gloo", "all_reduce": [1.0, 1.0], "engine": "FSDPEngineWithLMHead"}


def test_importing_without_cpu_request_changes_nothing(fresh):
    out = _result(fresh["no-cpu-request"])
    assert out["device"] != "cpu" and out["patched"] is False


VERSION_PROBE = r"""
import importlib.metadata, json
_real = importlib.metadata.version
importlib.metadata.version = lambda p: "0.8.0" if p == "verl" else _real(p)
try:
    import verl  # VERL_USE_EXTERNAL_MODULES=rpg.cpu.platform with VERL_PLATFORM=cpu installs the shims here
    print("RESULT" + json.dumps(None))
except RuntimeError as e:
    print("RESULT" + json.dumps(str(e)))
"""

SIGNATURE_PROBE = r"""
import json
import verl.utils.distributed as vd
orig = vd.initialize_global_process_group_ray
def initialize_global_process_group_ray(timeout_second=None, backend=None, device_id=None):
    return orig(timeout_second, backend)
initialize_global_process_group_ray.__module__ = orig.__module__
vd.initialize_global_process_group_ray = initialize_global_process_group_ray
from rpg.cpu import platform
try:
    platform.install()
    error = None
except RuntimeError as e:
    error = str(e)
print("RESULT" + json.dumps({"error": error, "replaced": vd.initialize_global_process_group_ray
                             is not initialize_global_process_group_ray}))
"""


@pytest.fixture(scope="module")
def fresh() -> dict[str, subprocess.CompletedProcess]:
    """The module's four fresh-process checks: the platform probe with and without VERL_PLATFORM=cpu, the version and
    the signature guards."""
    cpu = {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "rpg.cpu.platform"}
    return fresh_process.run({"cpu": (PLATFORM_PROBE, [], _env(**cpu)),
                              "no-cpu-request": (PLATFORM_PROBE, [], _env(VERL_USE_EXTERNAL_MODULES="rpg.cpu.platform")),
                              "version": (VERSION_PROBE, [], _env(**cpu)), "signature": (SIGNATURE_PROBE, [], _env())})


def test_shims_refuse_a_verl_version_they_were_not_written_for(fresh):
    error = _result(fresh["version"])
    assert "verl 0.8.0" in error and "verl>=0.9.1,<0.10" in error and "CPU-platform shims" in error


def test_shims_refuse_a_changed_signature_and_replace_nothing(fresh):
    out = _result(fresh["signature"])
    name = "verl.utils.distributed.initialize_global_process_group_ray"
    assert f"{name}('timeout_second', 'backend')" in out["error"] and "CPU-platform shims" in out["error"]
    assert f"{name}('timeout_second', 'backend', 'device_id')" in out["error"]
    assert out["replaced"] is False


# --------------------------------------------------------------------------------------------------- sampler --
def make_sampler(**sampler_kwargs):
    from rpg.cpu.sampler import FastPollReplayBuffer

    return FastPollReplayBuffer(trainer_mode="sync", trainer_config=OmegaConf.create({}), max_off_policy_threshold=None,
                                max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create(sampler_kwargs),
                                refill_fn=lambda *a, **k: None)


def test_fast_poll_sampler_reads_filter_groups_from_interpolated_config():
    cfg = OmegaConf.create({
        "algorithm": {"filter_groups": {"enable": True, "metric": "acc", "max_inflight_gen_batches": 3}},
        "data": {"train_batch_size": 16},
        "sampler_kwargs": {"poll_interval": 0.05, "filter_groups": "${algorithm.filter_groups}",
                           "train_batch_size": "${data.train_batch_size}"},
    })
    from rpg.cpu.sampler import FastPollReplayBuffer

    buf = FastPollReplayBuffer(trainer_mode="sync", trainer_config=OmegaConf.create({}), max_off_policy_threshold=None,
                               max_off_policy_strategy="drop", sampler_kwargs=cfg.sampler_kwargs,
                               refill_fn=lambda *a, **k: None)
    assert (buf.poll_interval, buf.filter_groups_metric, buf.gen_batch_size, buf.max_inflight_gen_batches,
            buf.train_batch_size) == (0.05, "acc", 1, 3, 16)
    plain = make_sampler(filter_groups={"enable": False, "metric": "acc"}, train_batch_size=8)
    assert (plain.filter_groups_metric, plain.gen_batch_size, plain.max_inflight_gen_batches) == (None, 8, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"train_batch_size": 8, "poll": 1}, "unknown keys"),
    ({}, "train_batch_size"),
    ({"train_batch_size": 8, "filter_groups": {"enable": True, "metric": None}}, "metric"),
])
def test_fast_poll_sampler_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_sampler(**kwargs)


# -------------------------------------------------------------------------------------------------- progress --
def test_progress_filter_summarises_verl_console_lines(tmp_path):
    from rpg.cpu.progress import follow

    console = (
        "\x1b[36m(TaskRunnerV1 pid=1)\x1b[0m WARNING target_num_threads 8 should not exceed\n"
        "\x1b[36m(TaskRunnerV1 pid=1)\x1b[0m step:0 - val-core/math_dapo/acc/mean@4:np.float64(0.3125) - x:1\n"
        "(TaskRunnerV1 pid=1) step:3 - critic/score/mean:-0.25 - timing_s/step:4.52 - actor/pg_loss:-0.01\n"
        "(TaskRunnerV1 pid=1) step:4 - critic/score/mean:0.5 - timing_s/step:5.48 - actor/rpg/kl:np.float64(0.00123)\n"
        "(TaskRunnerV1 pid=1) step:5 - timing_s/step:150.0 - actor/kl_loss:0.5\n"
        "Traceback (most recent call last):\n"
    )
    out, log = io.StringIO(), io.StringIO()
    follow(io.StringIO(console), log, out, total=10)
    assert log.getvalue() == console
    assert out.getvalue().splitlines() == [
        "[progress] step 0/10 | VALIDATION acc  31.2% (val-core/math_dapo/acc/mean@4)",
        "[progress] step 3/10 | train acc  37.5% | 4.5 s/step | ETA 32 s",  # (10 − 3) steps × 4.52 s
        "[progress] step 4/10 | train acc  75.0% | KL 1.23e-03 | 5.5 s/step | ETA 30 s",  # 6 × mean(4.52, 5.48)
        "[progress] step 5/10 | KL 5.00e-01 | 150.0 s/step | ETA 4 min 27 s",  # 5 × 160/3 s = 267 s; verl's KL loss
        "Traceback (most recent call last):",
    ]
