"""The plugin patches verl only where a run asks for it, in one place (rpg/install.py, through the table of patch points
rpg/patches.py), and only a verl it was written for (rpg/compat.py).

Fresh processes: after `import verl` and importing verl's worker and trainer modules, verl's `ppo_loss`,
`ActorRolloutRefWorker.update_actor/save_checkpoint/load_checkpoint` and verl's trainer registry are verl's own and no
rpg import hook is on `sys.meta_path`, while every RPG name is registered; building `RPGPolicyLossConfig` with
`reference=periodic`, `reference=frozen` or `grpo_wk3` changes none of them (plain objects). `import verl` with
`RPG_INSTALL` set installs exactly what it names. A fake verl version or a changed signature makes the installation
fail before anything is patched, with a message naming both; the launcher refuses it before Ray, and the loss names
the fix when its adapter is missing. Each of these nine checks runs in a process of its own where verl and rpg were
never imported, all forked from one interpreter that preloaded verl's third-party libraries (`fresh_process`), built
once for the module (the `fresh` fixture).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import textwrap

import fresh_process
import pytest

from rpg import compat, install

PRELUDE = textwrap.dedent(
    """
    import json, sys
    import verl
    import verl.workers.engine_workers as ew
    import verl.workers.utils.losses as losses
    import verl.trainer.main_ppo, verl.trainer.ppo.core_algos, verl.trainer.ppo.v1  # noqa: F401
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    import verl.trainer.ppo.v1.trainer_base as trainer_base
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    METHODS = ("update_actor", "save_checkpoint", "load_checkpoint")

    VERL_DIR = verl.__file__.rsplit("/", 1)[0] + "/"

    def verls_own(fn, path):
        # fn and every function it wraps (verl's own decorators) are code from verl's files, the innermost `path`
        chain = [fn]
        while hasattr(chain[-1], "__wrapped__"):
            chain.append(chain[-1].__wrapped__)
        return (all(f.__code__.co_filename.startswith(VERL_DIR) for f in chain)
                and chain[-1].__code__.co_filename.endswith(path))

    def state():
        cls = ew.ActorRolloutRefWorker
        return {
            "ppo_loss": verls_own(losses.ppo_loss, "verl/workers/utils/losses.py") and ew.ppo_loss is losses.ppo_loss,
            "worker": all(verls_own(cls.__dict__[m], "verl/workers/engine_workers.py") for m in METHODS),
            "trainers": all(c.__module__.startswith("verl.") for c in TRAINER_REGISTRY.values()),
            "debug_metrics": verls_own(trainer_base.calculate_debug_metrics, "verl/utils/debug/metrics.py"),
        }
    """
)

SCOPE = PRELUDE + textwrap.dedent(
    """
    from rpg.loss_config import RPGPolicyLossConfig
    from rpg.loss_table import LOSSES

    out = {"import": state(),
           "finders": [f"{type(f).__module__}.{type(f).__qualname__}" for f in sys.meta_path],
           "registered": sorted(n for n in LOSSES if n in POLICY_LOSS_REGISTRY),
           "estimators": sorted(n for n in ("rpg", "rpg_batchmean") if n in ADV_ESTIMATOR_REGISTRY)}
    for name, kwargs in json.loads(sys.argv[1]):
        RPGPolicyLossConfig(**kwargs)
        out[name] = state()
    print(json.dumps(out))
    """
)

ORIGINAL = {"ppo_loss": True, "worker": True, "trainers": True, "debug_metrics": True}
CONFIGS = [
    ("periodic", {"loss_mode": "rpg_ufkl", "reference": "periodic", "ref_refresh_steps": 4}),
    ("frozen", {"loss_mode": "rpg_reinforce_hardclip_rkl", "reference": "frozen"}),
    ("grpo_wk3", {"loss_mode": "grpo_wk3"}),
    ("verl_periodic", {"loss_mode": "vanilla", "reference": "periodic", "ref_refresh_kl": 0.1}),
]


def _env(**extra: str) -> dict[str, str]:
    drop = ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM", "VERL_ENGINE_DEVICE", install.ENV)
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_verl_and_building_configs_patch_nothing(fresh):
    out = _json(fresh["scope"])
    assert out["import"] == ORIGINAL  # verl's own objects after importing verl, its workers and its trainers
    assert not [f for f in out["finders"] if f.startswith("rpg")], out["finders"]
    from rpg.loss_table import LOSSES

    assert out["registered"] == sorted(LOSSES) and out["estimators"] == ["rpg", "rpg_batchmean"]
    assert {name: out[name] for name, _ in CONFIGS} == {name: ORIGINAL for name, _ in CONFIGS}  # plain objects


def _state(**changed: bool) -> dict[str, bool]:
    """`ORIGINAL` with the `changed` entries."""
    return {**ORIGINAL, **changed}


# `periodic_reference`: the former name of `worker_hooks`, accepted as an alias
INSTALLS = [
    ("ref_log_prob", _state(ppo_loss=False)),
    ("schedule_free, periodic_reference", _state(worker=False, trainers=False)),
    ("worker_hooks", _state(worker=False)),
    ("mismatch_share", _state(debug_metrics=False)),
]


@pytest.mark.parametrize("names, expected", INSTALLS)
def test_rpg_install_installs_exactly_what_it_names(fresh, names, expected):
    out = _json(fresh[f"install {names}"])
    assert out["import"] == expected


GUARD = PRELUDE + textwrap.dedent(
    """
    import importlib.metadata
    exec(sys.argv[2])  # the sabotage: a fake verl version or a changed signature
    from rpg import install
    try:
        install.install(json.loads(sys.argv[1]))
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    print(json.dumps({"error": error, "state": state(), "registered": "rpg_urkl" in POLICY_LOSS_REGISTRY}))
    """
)

FAKE_VERSION = """
_real_version = importlib.metadata.version
importlib.metadata.version = lambda p: "0.10.0" if p == "verl" else _real_version(p)
"""

CHANGED_PPO_LOSS = """
_orig = losses.ppo_loss
def ppo_loss(config, model_output, data, dp_group=None, loss_scale=1.0):
    return _orig(config, model_output, data, dp_group)
ppo_loss.__module__, ppo_loss.__qualname__ = _orig.__module__, _orig.__qualname__
losses.ppo_loss = ew.ppo_loss = ppo_loss
"""

CHANGED_UPDATE_ACTOR = """
_orig = ew.ActorRolloutRefWorker.__dict__["update_actor"]
def update_actor(self, data, timing=None):
    return _orig(self, data)
update_actor.__module__, update_actor.__qualname__ = _orig.__module__, _orig.__qualname__
ew.ActorRolloutRefWorker.update_actor = update_actor
"""


SABOTAGES = {
    "verl-version": (FAKE_VERSION, ["ref_log_prob", "worker_hooks", "mismatch_share"]),
    "ppo_loss-signature": (CHANGED_PPO_LOSS, ["ref_log_prob"]),
    "update_actor-signature": (CHANGED_UPDATE_ACTOR, ["ref_log_prob", "worker_hooks"]),
}
WORKER_HOOKS = "periodic/EMA-reference and adaptive-β hooks"


@pytest.mark.parametrize(
    "case, needles",
    [
        ("verl-version", ["verl 0.10.0", "verl>=0.9.1,<0.10", "ref_log_prob adapter"]),
        ("ppo_loss-signature",
         ["verl.workers.utils.losses.ppo_loss('config', 'model_output', 'data', 'dp_group')",
          "verl.workers.utils.losses.ppo_loss('config', 'model_output', 'data', 'dp_group', 'loss_scale')",
          "verl 0.9.1", "ref_log_prob adapter"]),
        (
            "update_actor-signature",
            [
                "ActorRolloutRefWorker.update_actor('self', 'data')",
                "ActorRolloutRefWorker.update_actor('self', 'data', 'timing')",
                "verl 0.9.1",
                WORKER_HOOKS,
            ],
        ),
    ],
    ids=["verl-version", "ppo_loss-signature", "update_actor-signature"],
)
def test_unsupported_verl_fails_at_start_up_naming_both_and_patches_nothing(fresh, case, needles):
    sabotage = SABOTAGES[case][0]
    out = _json(fresh[case])
    assert out["error"] and out["error"].startswith("RuntimeError"), out
    for needle in needles:
        assert needle in out["error"], (needle, out["error"])
    assert out["state"]["ppo_loss"] or sabotage is CHANGED_PPO_LOSS  # the adapter was not installed
    # nothing patched (the sabotaged object is not from verl's file)
    unpatched = _state(ppo_loss=sabotage is not CHANGED_PPO_LOSS, worker=sabotage is not CHANGED_UPDATE_ACTOR)
    assert out["state"] == unpatched
    assert out["registered"]  # registration needs no patch and works on any verl


# ---- rpg.compat ---------------------------------------------------------------------------------------------------
def test_require_version_returns_the_installed_version_or_names_everything():
    assert compat.require_version("verl", compat.SUPPORTED_VERL, "x") == compat.installed_version("verl")
    with pytest.raises(RuntimeError) as info:
        compat.require_version("verl", ">=9.0", "the frobnicator patch")
    needles = ("verl>=9.0", f"verl {compat.installed_version('verl')}", "the frobnicator patch")
    assert all(s in str(info.value) for s in needles)
    with pytest.raises(RuntimeError, match="not installed"):
        compat.require_version("surely-not-a-package-rpg", ">=1", "x")


def test_require_signature_names_function_expected_actual_and_patch():
    def target(a, b=1, *, c=2):
        return a

    compat.require_signature(target, ("a", "b", "c"), "x")
    with pytest.raises(RuntimeError) as info:
        compat.require_signature(target, ("a", "b"), "the frobnicator patch")
    message = str(info.value)
    qualname = f"{__name__}.{target.__qualname__}"
    assert f"{qualname}('a', 'b')" in message and f"{qualname}('a', 'b', 'c')" in message
    assert "the frobnicator patch" in message


# ---- failing clearly where the adapter is needed but absent -----------------------------------------------------------
UNPICKLED_LOSS = textwrap.dedent(
    """
    import pickle, sys, torch
    import verl
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    cfg = pickle.loads(bytes.fromhex(sys.argv[1]))  # built elsewhere: its __post_init__ did not run in this process
    old = -torch.rand(2, 3)
    try:
        POLICY_LOSS_REGISTRY["rpg_urkl"](old, old + 0.1, torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool),
                                         "token-mean", cfg, None)
        print("no error")
    except RuntimeError as e:
        print(e)
    """
)


def _unpickled_config() -> str:
    from verl_batch import actor_config

    return pickle.dumps(actor_config("rpg_urkl", reference="periodic", ref_refresh_steps=2)).hex()


def test_the_loss_names_a_missing_adapter_and_the_fix(fresh):
    """A run started without the launcher (e.g. python -m verl.trainer.main_ppo) and without RPG_INSTALL."""
    proc = fresh["unpickled"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = proc.stdout.strip().splitlines()[-1]
    assert "ref_log_prob adapter around verl's ppo_loss" in message and "not installed in this process" in message
    assert WORKER_HOOKS in message and "python -m rpg.launch" in message
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.RPG_INSTALL=ref_log_prob,worker_hooks" in message


LAUNCHER = textwrap.dedent(
    """
    import importlib.metadata
    _real = importlib.metadata.version
    importlib.metadata.version = lambda p: "0.10.0" if p == "verl" else _real(p)
    from rpg.launch import RecipeConfigError, compose_config, validate
    config = compose_config(["actor_rollout_ref.rollout.name=vllm", "algorithm.adv_estimator=rpg",
        "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=grpo_wk3",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0"])
    try:
        validate(config)
        print("no error")
    except RecipeConfigError as e:
        print(str(e).replace(chr(10), " "))
    """
)


def test_the_launcher_refuses_an_unsupported_verl_before_ray(fresh):
    proc = fresh["launcher"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = proc.stdout.strip().splitlines()[-1]
    assert "verl 0.10.0" in message and "verl>=0.9.1,<0.10" in message and "ref_log_prob adapter" in message


@pytest.fixture(scope="module")
def fresh() -> dict[str, subprocess.CompletedProcess]:
    """The module's fresh-process checks, each `python -c CODE ARGS` in `_env(...)`, forked from one interpreter."""
    cases = {
        "scope": (SCOPE, [json.dumps(CONFIGS)], _env()),
        **{f"install {names}": (SCOPE, ["[]"], _env(**{install.ENV: names})) for names, _ in INSTALLS},
        **{case: (GUARD, [json.dumps(names), sabotage], _env()) for case, (sabotage, names) in SABOTAGES.items()},
        "unpickled": (UNPICKLED_LOSS, [_unpickled_config()], _env()),
        "launcher": (LAUNCHER, [], _env()),
    }
    return fresh_process.run(cases)


# ---- the launcher's side of the contract: what a composed config selects, exported to every Ray process ------------
BASE = ["algorithm.adv_estimator=rpg", "actor_rollout_ref.actor.policy_loss._target_=rpg.RPGPolicyLossConfig"]


PL = "actor_rollout_ref.actor.policy_loss."
REF = ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0"]  # verl's reference model
SCHEDULE_FREE = [
    "trainer.v1.trainer_mode=schedule_free_sync",
    "actor_rollout_ref.actor.optim.optimizer_impl=schedulefree",
    "actor_rollout_ref.actor.optim.optimizer=AdamWScheduleFree",
]
SELECTS = {
    "iterative": ([f"{PL}loss_mode=rpg_reinforce_urkl"], ()),
    "frozen": ([f"{PL}loss_mode=rpg_urkl", f"+{PL}reference=frozen", *REF], ("ref_log_prob",)),
    "grpo_wk3": ([f"{PL}loss_mode=grpo_wk3", *REF], ("ref_log_prob",)),
    "periodic": (
        [f"{PL}loss_mode=rpg_ufkl", f"+{PL}reference=periodic", f"+{PL}ref_refresh_steps=4", *REF],
        ("ref_log_prob", "worker_hooks"),
    ),
    "schedule_free": ([f"{PL}loss_mode=rpg_urkl", *SCHEDULE_FREE], ("schedule_free",)),
    "topk": (
        [f"{PL}loss_mode=rpg_urkl", f"+{PL}reference=frozen", f"+{PL}kl_estimator=topk", *REF],
        ("ref_log_prob", "topk_kl"),
    ),
}


@pytest.mark.parametrize("overrides, expected", list(SELECTS.values()), ids=list(SELECTS))
def test_the_launcher_selects_and_exports_what_the_config_needs(overrides, expected):
    from rpg.launch import compose_and_validate

    validated = compose_and_validate(BASE + overrides)  # every check; `install.selected` of the typed policy loss
    config = validated.config
    assert validated.install == expected
    environ: dict[str, str] = {}
    value = install.export(config, reversed(expected), environ)  # the order given does not matter
    assert environ == {install.ENV: value} and install.names(value) == expected  # what the plugin reads back
    assert config.ray_kwargs.ray_init.runtime_env.env_vars[install.ENV] == value  # verl's run_ppo → ray.init


def test_an_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        install.names("ref_log_prob,periodic")
    assert "'periodic'" in str(info.value) and all(n in str(info.value) for n in install.NAMES)
