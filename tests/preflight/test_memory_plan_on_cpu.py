"""The GPU memory plan (rpg.preflight.memory, docs/gpu.md#memory-plan): exact parameter counts of the recipe models,
bytes per state for each dtype/offload setting, the plan line and problems, and the plan of shipped recipes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from rpg.preflight import memory as M

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))

GIB = M.GIB
TABLE = M.shipped_models()
SHAPES = {name: M.ModelShape.from_dict(name, cfg) for name, cfg in TABLE.items()}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_param_count_matches_a_meta_device_instantiation(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = dict(TABLE[name])
    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[cfg.pop("model_type")]
    cfg.pop("torch_dtype")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cls(**cfg))
    # unique parameters: a tied lm_head shares the embedding tensor
    expected = sum(p.numel() for p in model.parameters())
    assert SHAPES[name].param_count() == expected


def test_published_sizes():
    assert SHAPES["Qwen/Qwen2.5-Math-7B"].param_count() == 7_615_616_512
    assert SHAPES["Qwen/Qwen3-4B"].param_count() == 4_022_468_096
    assert SHAPES["Qwen/Qwen2.5-Math-7B"].max_position_embeddings == 4096


def _terms(plan):
    return {k.split(" (")[0]: v for k, v in {**plan.rollout, **plan.update}.items()}


@pytest.mark.parametrize("param_bytes", [4, 2])
@pytest.mark.parametrize("n_gpus", [8, 16])
def test_bytes_per_state(param_bytes, n_gpus):
    m = SHAPES["Qwen/Qwen2.5-7B-Instruct"]
    P = m.param_count()
    plan = M.estimate(m, M.Settings(n_gpus=n_gpus, param_bytes=param_bytes), 80.0)
    assert plan.rollout["actor params"] == pytest.approx(P * param_bytes / n_gpus / GIB)
    assert plan.rollout["optimizer states"] == pytest.approx(2 * P * 4 / n_gpus / GIB)  # AdamW: 2 fp32 states
    step = M.estimate(m, M.Settings(n_gpus=n_gpus, param_bytes=param_bytes, update_tokens=1, infer_tokens=1), 80.0)
    assert step.moments["optimizer step"] == pytest.approx(
        2 * M.CUDA_CONTEXT_GIB + M.NCCL_GIB + M.VLLM_SLEEP_REMAINDER_GIB
        + P * (3 * param_bytes + 8) / n_gpus / GIB)  # params + grads + foreach temp + 2 states


def test_offload_removes_the_resident_terms_from_rollout_only():
    m = SHAPES["Qwen/Qwen2.5-Math-7B"]
    base = M.estimate(m, M.Settings(), 80.0)
    off = M.estimate(m, M.Settings(param_offload=True, optimizer_offload=True), 80.0)
    P = m.param_count()
    assert base.rollout_gib - off.rollout_gib == pytest.approx(P * (4 + 8) / 8 / GIB)
    assert off.update_gib == pytest.approx(base.update_gib)  # train_mode loads both back onto the GPU


def test_schedule_free_has_two_states_and_no_foreach_temp():
    assert M.optimizer_states("AdamWScheduleFree") == (2, False)
    assert M.optimizer_states("AdamW") == (2, True)


def test_vllm_pool_is_a_fraction_of_total_and_not_shrunk_by_tp():
    m = SHAPES["Qwen/Qwen2.5-Math-7B"]
    for tp in (1, 2):
        plan = M.estimate(m, M.Settings(gpu_memory_utilization=0.6, rollout_tp=tp), 80.0)
        assert plan.rollout["vLLM pool (0.6 × budget)"] == pytest.approx(48.0)
    tp1 = M.estimate(m, M.Settings(gpu_memory_utilization=0.6), 80.0)
    tp2 = M.estimate(m, M.Settings(gpu_memory_utilization=0.6, rollout_tp=2), 80.0)
    assert tp2.kv_cache_gib > tp1.kv_cache_gib


def test_free_cache_engine_false_keeps_the_pool_during_update():
    m = SHAPES["Qwen/Qwen3-4B"]
    awake = M.estimate(m, M.Settings(free_cache_engine=False), 80.0)
    assert awake.update["vLLM asleep"] == pytest.approx(M.CUDA_CONTEXT_GIB + 0.85 * 80)


def test_logits_term_scales_with_tokens_and_vocab():
    m = SHAPES["Qwen/Qwen3-4B"]
    a = M.estimate(m, M.Settings(update_tokens=4096, infer_tokens=1), 80.0)
    b = M.estimate(m, M.Settings(update_tokens=8192, infer_tokens=1), 80.0)
    assert b.update["logits"] - a.update["logits"] == pytest.approx(4096 * m.vocab_size * 2 / GIB)


def test_line_format():
    plan = M.estimate(SHAPES["Qwen/Qwen3-4B"], M.Settings(), 80.0, model="Qwen/Qwen3-4B")
    assert plan.line() == (f"[rpg] GPU memory plan (per GPU, Qwen/Qwen3-4B, budget 80.0 GiB): "
                           f"rollout {plan.rollout_gib:.1f} GiB, update {plan.update_gib:.1f} GiB")


def test_problems_name_the_phase_numbers_and_a_fix_that_fits():
    m = SHAPES["Qwen/Qwen2.5-Math-7B"]
    plan = M.estimate(m, M.Settings(gpu_memory_utilization=0.85), 80.0)
    (msg,) = plan.problems()
    assert "rollout phase" in msg and "actor_rollout_ref.rollout.gpu_memory_utilization" in msg
    assert "optimizer_offload=True" in msg and f"{plan.rollout_gib:.1f} GiB" in msg
    frac = plan.max_gpu_memory_utilization()
    assert f"to {frac:.2f}" in msg
    fixed = M.estimate(m, M.Settings(gpu_memory_utilization=frac), 80.0)
    assert fixed.problems() == [] and fixed.rollout_gib <= 80.0 - M.HEADROOM_GIB
    assert M.estimate(m, M.Settings(gpu_memory_utilization=frac + 0.05), 80.0).problems()


def test_update_problem_proposes_a_token_budget_that_fits():
    m = SHAPES["Qwen/Qwen2.5-Math-7B"]
    plan = M.estimate(m, M.Settings(update_tokens=200_000, infer_tokens=4096, gpu_memory_utilization=0.5), 80.0)
    msgs = plan.problems()
    assert len(msgs) == 1 and "update phase" in msgs[0] and "ppo_max_token_len_per_gpu" in msgs[0]
    tokens = plan.max_update_tokens()
    assert f"to {tokens} or below" in msgs[0]
    ok = M.estimate(m, plan.settings.replace(update_tokens=tokens), 80.0)
    assert ok.update_gib <= 78.0 < M.estimate(m, plan.settings.replace(update_tokens=tokens + 1), 80.0).update_gib


def test_sampler_term_is_vllms_sampler_arithmetic():
    """vLLM 0.24's sampler at its peak (docs/gpu.md#sampler): 18 bytes per row and vocabulary entry over
    min(max_num_seqs, max_num_batched_tokens) rows; profiled by vLLM (inside the pool: it shrinks the KV cache) in
    verl's processed_logprobs mode, and 4 of them on top of the pool in a raw_* mode."""
    m = SHAPES["Qwen/Qwen2.5-Math-7B"]
    s = M.Settings(max_num_seqs=1024, max_num_batched_tokens=4096)
    peak, outside = M.sampler_gib(m, s)
    assert peak == (2 + 4 + 4 + 4 + 4) * 1024 * 152_064 / GIB and outside == 0.0
    assert round(peak, 2) == 2.61
    assert M.sampler_gib(m, s.replace(max_num_batched_tokens=512))[0] == peak / 2  # rows bounded by the token budget
    assert M.sampler_gib(m, s.replace(rollout_tp=2)) == (peak, 0.0)  # every TP rank samples the gathered logits
    raw = s.replace(logprobs_mode="raw_logprobs")
    assert M.sampler_gib(m, raw) == (peak, 4 * 1024 * 152_064 / GIB)
    base, raw_plan = M.estimate(m, s), M.estimate(m, raw)
    assert raw_plan.rollout_gib - base.rollout_gib == pytest.approx(4 * 1024 * 152_064 / GIB)
    no_sampler = base.kv_cache_gib + peak  # the pool less the weights and 1 GiB
    assert no_sampler == pytest.approx(s.gpu_memory_utilization * 80 - m.param_count() * 2 / GIB - 1.0)


def test_budget_env(monkeypatch):
    monkeypatch.setenv("GPU_MEMORY_GIB", "141")
    assert M.budget_from_env() == 141.0
    monkeypatch.setenv("GPU_MEMORY_GIB", "eighty")
    with pytest.raises(ValueError, match="GPU_MEMORY_GIB='eighty' is not a positive number"):
        M.budget_from_env()


def test_model_config_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert M.load_model_shape("Qwen/Qwen3-4B").param_count() == 4_022_468_096  # shipped table
    local = tmp_path / "tiny"
    local.mkdir()
    (local / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, '
                                       '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, '
                                       '"vocab_size": 1000, "tie_word_embeddings": true}')
    assert M.load_model_shape(str(local)).num_hidden_layers == 2
    snap = tmp_path / "hub" / "models--Org--Tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((local / "config.json").read_text())
    assert M.load_model_shape("Org/Tiny").hidden_size == 64
    with pytest.raises(ValueError, match="actor_rollout_ref.model.path='Org/Missing' has no config.json"):
        M.load_model_shape("Org/Missing")


# ------------------------------------------------------------------------------------------------------------
# Shipped recipes (composed from the scripts' own overrides, as tests/recipes do)
# ------------------------------------------------------------------------------------------------------------
RECIPES = ["7b/run_rpg_7b_urkl1e-4.sh", "7b/run_grpo_7b.sh", "7b/run_rpg_7b_fkl1e-4_rf_clip_ppo_0.2_0.28.sh",
           "4b/run_rpg_urkl_8k.sh"]


def _plan(script: str, **over):
    import recipe_helpers as H

    overrides = H.overrides(H.RECIPE / script)
    overrides += [f"{k}={v}" for k, v in over.items()]
    from rpg.launch import compose_config

    return M.memory_plan(compose_config(overrides), budget_gib=80.0)


@pytest.mark.parametrize("script", RECIPES)
def test_recipe_plans(script):
    plan = _plan(script)
    s = plan.settings
    shipped = 0.75 if script.startswith("7b/") else 0.8  # the recipes' vLLM share (docs/differences.md#d28)
    assert s.n_gpus == 8 and s.gpu_memory_utilization == shipped and s.rollout_tp == 1
    assert s.param_bytes == 4 and s.compute_bytes == 2 and not s.param_offload and not s.optimizer_offload
    assert s.gradient_checkpointing
    assert s.reference == ("grpo" in script)  # GRPO's KL loss builds the frozen reference model
    print(plan.breakdown())
    assert plan.problems() == [] and plan.rollout_gib <= 78.0 - 4  # 8 × 80 GiB with 4 GiB to spare
    if script.startswith("7b/"):
        authors = _plan(script, **{"actor_rollout_ref.rollout.gpu_memory_utilization": 0.85})
        assert authors.rollout_gib > 78.0 and authors.problems(), "7B at 0.85 should not fit (docs/gpu.md#memory-plan)"
        assert authors.max_gpu_memory_utilization() == 0.8
    assert math.isfinite(plan.update_gib) and plan.update_gib < plan.rollout_gib
