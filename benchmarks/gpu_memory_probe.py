"""Measure the peak memory of one FSDP2 update and compare it with rpg.preflight.memory's prediction
(docs/gpu.md#checking-the-plan-on-one-gpu).

Needs only torch and transformers (no verl, vLLM or Ray). On one GPU it builds a recipe model's config with fewer
decoder layers (random weights, fp32 parameters), wraps every layer and the root with FSDP2 ``fully_shard`` on a
single-rank process group (bf16 compute, fp32 reduce, as verl's defaults), enables gradient checkpointing, and runs
two AdamW steps on one packed sequence of ``--tokens`` tokens (the recipe's ``ppo_max_token_len_per_gpu``). The
peak of the second step (the optimizer states exist by then) is printed next to the estimator's update-phase
prediction for the same reduced config, without the terms a lone process does not have (CUDA contexts, NCCL,
a sleeping vLLM), for the cross-entropy path it took (flash-attn's in-place kernel, or torch's when flash-attn is
not installed) and a lone micro-batch (no accumulated gradients), with a verdict per layer count: OK when the plan
is at most `LOW_GIB` under the measurement, PLAN TOO LOW otherwise. Each layer count runs in a fresh process (one
process for several keeps the previous model's fp32 parameters alive: an H200 run printed a 7.26 GiB/layer slope
instead of 4.36); with two or more ``--layers`` values it also fits the per-layer slope.

    python benchmarks/gpu_memory_probe.py --model Qwen/Qwen2.5-Math-7B --layers 2 4 8 --tokens 4096
    python benchmarks/gpu_memory_probe.py --device cpu --tiny      # the test's smoke mode: no measurement

The measured peak is ``torch.cuda.max_memory_allocated`` (what the caching allocator handed out), so it excludes
the CUDA context and fragmentation; compare ``max_memory_reserved`` for the latter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rpg.preflight import memory as M  # noqa: E402 (pure: no verl import)

LOW_GIB = 0.5  # the plan may be this much under a measured peak before the verdict says it is too low
TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": False,
        "max_position_embeddings": 256}


def build_model(cfg: dict, layers: int, device: torch.device, attn: str):
    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cfg = {k: v for k, v in cfg.items() if k not in ("torch_dtype",)} | {"num_hidden_layers": layers}
    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[cfg.pop("model_type")]
    config = cls(**cfg)
    config._attn_implementation = attn
    with device:
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Per-token log-probs as verl computes them (flash-attn's in-place cross-entropy when installed)."""
    try:
        from flash_attn.ops.triton.cross_entropy import cross_entropy_loss

        if logits.is_cuda:
            return -cross_entropy_loss(logits, labels, inplace_backward=True)[0], "flash-attn CE"
    except ImportError:
        pass
    return -torch.nn.functional.cross_entropy(logits, labels, reduction="none"), "torch CE (extra logits copies)"


def run_one(cfg: dict, layers: int, tokens: int, device: torch.device, attn: str) -> dict:
    model = build_model(cfg, layers, device, attn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (1, tokens), generator=gen).to(device)
    pos = torch.arange(tokens, device=device).unsqueeze(0)
    cuda = device.type == "cuda"
    path = ""
    for step in range(2):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        logits = model(input_ids=ids, position_ids=pos).logits.squeeze(0)[:-1]
        logp, path = token_logprobs(logits, ids[0, 1:])
        loss = -logp.float().mean()
        loss.backward()
        del logits, logp
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite loss at step {step}")
    out = {"layers": layers, "tokens": tokens, "loss": float(loss), "ce": path, "measured_gib": None}
    if cuda:
        torch.cuda.synchronize()
        out["measured_gib"] = torch.cuda.max_memory_allocated() / M.GIB
        out["reserved_gib"] = torch.cuda.max_memory_reserved() / M.GIB
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return out


def predicted_gib(cfg: dict, layers: int, tokens: int, flash_ce: bool = True) -> float:
    """The estimator's update-phase peak for this reduced config on one rank (one micro-batch: no gradients
    accumulated before its backward), less the process-external terms."""
    shape = M.ModelShape.from_dict("probe", cfg | {"num_hidden_layers": layers})
    settings = M.Settings(n_gpus=1, update_tokens=tokens, infer_tokens=1, flash_ce=flash_ce, accumulated_grads=False)
    plan = M.estimate(shape, settings, 80.0)
    peak = max(plan.moments[k] for k in ("backward", "end of backward", "optimizer step"))
    return peak - (2 * M.CUDA_CONTEXT_GIB + M.NCCL_GIB + M.VLLM_SLEEP_REMAINDER_GIB)


def verdict(r: dict) -> str:
    if r["measured_gib"] is None:
        return "n/a"
    return "OK" if r["predicted_gib"] >= r["measured_gib"] - LOW_GIB else f"PLAN TOO LOW (by more than {LOW_GIB} GiB)"


def measure_here(args, cfg: dict, tokens: int, layers: int) -> dict:
    """One layer count in this process (the child of `main`)."""
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)

    import torch.distributed as dist

    store = tempfile.NamedTemporaryFile(prefix="rpg-probe-", delete=False)
    store.close()
    os.unlink(store.name)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method=f"file://{store.name}",
                            rank=0, world_size=1)
    try:
        r = run_one(cfg, layers, tokens, device, args.attn or "sdpa")
    finally:
        dist.destroy_process_group()
    r["predicted_gib"] = predicted_gib(cfg, layers, tokens, flash_ce=r["ce"] == "flash-attn CE")
    r["pid"] = os.getpid()
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-Math-7B", choices=sorted(M.shipped_models()))
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tokens", type=int, default=4096, help="packed tokens per micro-batch (ppo_max_token_len_per_gpu)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen2 config (64 tokens): checks the probe runs")
    ap.add_argument("--attn", default=None, help="attention implementation (default: sdpa)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one layer count; prints JSON
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU; use --device cpu --tiny for the smoke mode")
    cfg = dict(TINY) if args.tiny else dict(M.shipped_models()[args.model])
    tokens = 64 if args.tiny else args.tokens
    if args.child:
        print("[probe-json] " + json.dumps(measure_here(args, cfg, tokens, args.layers[0])), flush=True)
        return 0
    results = []
    base = [a for a in (argv if argv is not None else sys.argv[1:])]
    for layers in args.layers:  # a fresh process each: nothing of the previous model stays allocated
        child = _without_layers(base) + ["--layers", str(layers), "--child"]
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *child], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[probe-json] ")]
        if proc.returncode != 0 or not lines:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            print(f"[probe] layers={layers}: the child process failed (exit {proc.returncode})")
            return 1
        r = json.loads(lines[-1].split(" ", 1)[1])
        results.append(r)
        meas = "n/a (CPU)" if r["measured_gib"] is None else f"{r['measured_gib']:.2f} GiB " \
            f"(reserved {r['reserved_gib']:.2f})"
        print(f"[probe] {'tiny' if args.tiny else args.model} layers={layers} tokens={tokens} ({r['ce']}, process "
              f"{r['pid']}): measured peak {meas}, planned {r['predicted_gib']:.2f} GiB, verdict {verdict(r)}, "
              f"loss {r['loss']:.3f}", flush=True)  # fmt: skip
    if len(results) >= 2 and results[0]["measured_gib"] is not None:
        a, b = results[0], results[-1]
        dl = b["layers"] - a["layers"]
        print(f"[probe] per-layer slope: measured {(b['measured_gib'] - a['measured_gib']) / dl:.3f} GiB, "
              f"planned {(b['predicted_gib'] - a['predicted_gib']) / dl:.3f} GiB")
    bad = [r["layers"] for r in results if verdict(r).startswith("PLAN TOO LOW")]
    print(f"[probe] verdict: {'the plan is too low at layers ' + str(bad) if bad else 'OK'}"
          + ("" if results[0]["measured_gib"] is not None else " (nothing measured on CPU)"))
    return 0


def _without_layers(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if a == "--layers":
            skip = True
            continue
        if skip and a.lstrip("-").isdigit() and not a.startswith("--"):
            continue
        skip = False
        out.append(a)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
