"""The GPU memory plan with LoRA (rpg.preflight.memory `lora_terms`; docs/gpu.md#lora): the adapter's parameter count
by hand and against peft, the frozen base without gradients or optimizer states, the adapter's own training state,
the reference's snapshot, vLLM's preallocated LoRA buffers, and LoRA's training state against full weights."""

from __future__ import annotations

import functools

import pytest

from rpg.preflight import memory as M

GIB = M.GIB
QWEN3_4B = M.ModelShape.from_dict("Qwen/Qwen3-4B", M.shipped_models()["Qwen/Qwen3-4B"])
ALL = M.LORA_ALL_LINEAR


def _lora(**kw) -> M.Settings:
    return M.Settings(**{"n_gpus": 1, "update_tokens": 8192, "infer_tokens": 8192, "gpu_memory_utilization": 0.65,
                         "lora_rank": 32, "lora_modules": ALL, "vllm_lora_rank": 32, **kw})


def test_the_adapter_of_qwen3_4b_at_rank_32_on_every_linear_layer_by_hand():
    """36 layers × 32 × Σ(in + out): q 2560+4096, k and v 2560+1024, o 4096+2560, gate and up 2560+9728, down
    9728+2560 = 57,344 per rank and layer: 66,060,288 (the issue's "about 66M")."""
    per_rank_layer = (2560 + 4096) + 2 * (2560 + 1024) + (4096 + 2560) + 3 * (2560 + 9728)
    assert per_rank_layer == 57_344
    assert QWEN3_4B.lora_params(32, ALL) == 36 * 32 * 57_344 == 66_060_288
    assert QWEN3_4B.lora_params(1, ALL) == 66_060_288 // 32  # linear in the rank
    assert QWEN3_4B.lora_params(8, ("q_proj", "v_proj")) == 36 * 8 * ((2560 + 4096) + (2560 + 1024))


def test_the_adapter_count_is_pefts():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    cfg = {k: v for k, v in M.shipped_models()["Qwen/Qwen3-4B"].items() if k not in ("model_type", "torch_dtype")}
    cfg.update(num_hidden_layers=2, vocab_size=1024)  # two layers: every shape of the 4B, a tenth of a second
    shape = M.ModelShape.from_dict("two-layer", {**cfg, "model_type": "qwen3"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**cfg))
    lora = peft.get_peft_model(model, peft.LoraConfig(r=32, lora_alpha=32, target_modules="all-linear"))
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert shape.lora_params(32, ALL) == trainable


@pytest.mark.parametrize("target, expected", [("all-linear", ALL), (["q_proj", "v_proj"], ("q_proj", "v_proj")),
                                              (["model.layers.0.mlp.down_proj"], ("down_proj",))])
def test_target_modules(target, expected):
    assert M.lora_modules(target) == expected


def test_an_unknown_target_module_names_the_setting():
    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.target_modules=.*linear_qkv"):
        M.lora_modules(["linear_qkv"])


def test_the_frozen_base_has_no_gradients_or_optimizer_states_and_the_adapter_has_both():
    """The mutant that forgets the adapter's optimizer states (or its gradients) fails the exact terms."""
    s, A, P = _lora(), 66_060_288, QWEN3_4B.param_count()
    plan = M.estimate(QWEN3_4B, s, 80.0)
    terms = plan.lora
    assert terms["frozen base (fp32; no grads, no optimizer states)"] == P * 4 / GIB
    assert terms["adapter (fp32)"] == terms["adapter grads"] == A * 4 / GIB
    assert terms["adapter optimizer states (2 fp32)"] == 2 * A * 4 / GIB  # AdamW's exp_avg and exp_avg_sq
    assert plan.rollout["optimizer states"] == 2 * A * 4 / GIB > 0  # resident during the rollout
    assert plan.update["grad shards"] == A * 4 / GIB
    assert plan.update["param shards"] == (P + A) * 4 / GIB
    step = plan.moments["optimizer step"]  # base + adapter + grads + 2 states + foreach temp of the adapter
    fixed = 2 * M.CUDA_CONTEXT_GIB + M.NCCL_GIB + M.VLLM_SLEEP_REMAINDER_GIB
    assert step == pytest.approx(fixed + (P * 4 + A * (4 + 4 + 8 + 4)) / GIB)


def test_loras_training_state_is_a_small_part_of_full_weights():
    lora = M.estimate(QWEN3_4B, _lora(), 80.0)
    full = M.estimate(QWEN3_4B, _lora(lora_rank=0, lora_modules=(), vllm_lora_rank=0), 80.0)
    trained = lambda plan: plan.update["grad shards"] + plan.update["optimizer states"]  # noqa: E731
    assert trained(lora) < 0.02 * trained(full)  # 0.74 GiB against 44.9 GiB
    assert full.rollout_gib - lora.rollout_gib == pytest.approx(full.rollout["optimizer states"]
                                                                - lora.rollout["optimizer states"]
                                                                - lora.lora["adapter (fp32)"])
    assert lora.update_gib < 0.5 * full.update_gib
    assert lora.problems() == [] and full.problems() != []  # one 80 GB GPU: LoRA fits, full weights do not


def test_the_reference_snapshot_is_one_fp32_adapter_in_both_phases():
    A = 66_060_288
    iterative = M.estimate(QWEN3_4B, _lora(), 80.0)
    periodic = M.estimate(QWEN3_4B, _lora(lora_reference_copies=1), 80.0)
    assert iterative.lora["reference adapter snapshot (fp32)"] == 0.0
    assert periodic.lora["reference adapter snapshot (fp32)"] == A * 4 / GIB
    for phase in ("rollout_gib", "update_gib"):
        assert getattr(periodic, phase) - getattr(iterative, phase) == pytest.approx(A * 4 / GIB)


@pytest.mark.parametrize("tp", [1, 2])
def test_vllms_lora_buffers_are_one_adapter_of_max_lora_rank_inside_its_pool(tp):
    """vLLM wraps every linear layer: at TP 1 its buffers are an all-linear adapter of max_lora_rank in bf16; at TP 2
    the split factor halves (A of column-parallel layers and B of row-parallel ones stay whole)."""
    plan = M.estimate(QWEN3_4B, _lora(vllm_lora_rank=64, rollout_tp=tp), 80.0)
    label = "vLLM LoRA buffers (max_loras 1, max_lora_rank 64, inside its pool)"
    h, i, q, kv = 2560, 9728, 4096, 1024
    whole = 5 * h + 2 * h  # A of q, k, v, gate, up (in = h); B of o and down (out = h)
    split = q + 2 * kv + 2 * i + q + i  # B of q, k, v, gate, up; A of o (in = q) and down (in = i)
    assert plan.lora[label] == 36 * 64 * (whole + split / tp) * 2 / GIB
    merged = M.estimate(QWEN3_4B, _lora(vllm_lora_rank=0, rollout_tp=tp), 80.0)
    assert merged.kv_cache_gib - plan.kv_cache_gib == pytest.approx(plan.lora[label])  # taken from the KV cache
    assert merged.rollout_gib == plan.rollout_gib  # inside the pool: the phase's total does not move
    if tp == 1:
        assert plan.lora[label] == QWEN3_4B.lora_params(64, ALL) * 2 / GIB


def test_full_weight_plans_have_no_lora_terms():
    plan = M.estimate(QWEN3_4B, M.Settings(), 80.0)
    assert plan.lora == {} and plan.lora_params == 0
    assert not any("adapter" in k or "LoRA" in k for k in {**plan.rollout, **plan.update})


# ---- docs/gpu.md#lora: the LoRA plan of Qwen3-4B at rank 32 beside the full-weight one, from the plan's code --------
@functools.lru_cache(maxsize=None)  # read only: each config composed and validated once
def _validated(script: str, *over: str):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
    import recipe_helpers as H

    from rpg.launch import compose_and_validate

    return compose_and_validate([*H.overrides(H.RECIPE / script), *over])


def _row(label: str, validated, **settings) -> str:
    """One row of docs/gpu.md#lora's table, from the launcher's plan of a validated recipe (80 GiB, an H100), with
    `settings` replaced in its plan's `Settings`."""
    from rpg.preflight import memory_config as MC

    plans = (MC.memory_plan(validated, budget_gib=80.0, flash_ce=ce) for ce in (True, False))
    plan, torch_ce = (M.estimate(p.shape, p.settings.replace(**settings), 80.0, model=p.model) for p in plans)
    s, lora = plan.settings, plan.lora
    params = plan.update["param shards"]
    reference = next((v for k, v in lora.items() if k.startswith("reference")), 0.0)
    vllm = next((v for k, v in lora.items() if k.startswith("vLLM LoRA")), 0.0)
    fits = "yes" if not (plan.problems() or torch_ce.problems()) else "**no**"
    return (f"| {label} | {s.n_gpus} | {s.gpu_memory_utilization:g} | {params:.2f} | {plan.update['grad shards']:.2f} "
            f"| {plan.update['optimizer states']:.2f} | {reference:.2f} | {vllm:.2f} | {plan.rollout_gib:.1f} | "
            f"{plan.update_gib:.1f} / {torch_ce.update_gib:.1f} | {plan.kv_cache_gib:.1f} | {fits} |")


def docs_rows() -> list[str]:
    lora = "1gpu/run_rpg_reinforce_urkl_4k_lora.sh"
    return [
        _row("full weights, 8 GPUs (the paper's row, `4b/run_rpg_reinforce_urkl_4k.sh`)",
             _validated("4b/run_rpg_reinforce_urkl_4k.sh")),
        _row("full weights, 1 GPU (the same with `trainer.n_gpus_per_node=1`)",
             _validated("4b/run_rpg_reinforce_urkl_4k.sh", "trainer.n_gpus_per_node=1",
                        "actor_rollout_ref.rollout.gpu_memory_utilization=0.65")),
        _row(f"LoRA rank 32, 1 GPU (`{lora}`)", _validated(lora)),
        _row("LoRA rank 32, 1 GPU, `reference=periodic` (one adapter snapshot)", _validated(lora),
             lora_reference_copies=1),  # the plan's count for periodic (`memory_config.lora_fields`)
        _row("LoRA rank 32, 1 GPU, `lora.merge=True` (no LoRA in vLLM)",
             _validated(lora, "actor_rollout_ref.model.lora.merge=True")),
    ]


def test_the_docs_lora_table_is_the_plans_output():
    """docs/gpu.md#lora's numbers are this plan's: a change of the plan that moves them fails here (print the rows
    with `python -c 'import tests.preflight.test_memory_plan_lora_on_cpu as t; print(*t.docs_rows(), sep=chr(10))'`)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "gpu.md").read_text()
    rows = docs_rows()
    missing = [row for row in rows if row not in doc]
    assert not missing, "docs/gpu.md#lora differs from the plan; the plan's rows:\n" + "\n".join(rows)
    assert "**no**" in rows[1] and all(row.endswith("| yes |") for row in rows[2:])
