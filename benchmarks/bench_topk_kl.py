"""The top-k KL's cost per update against the log-prob path every update already runs, and its gradient variance.

    .venv/bin/python benchmarks/bench_topk_kl.py                           # CPU fp32, indicative
    .venv/bin/python benchmarks/bench_topk_kl.py --vocab 151936 --tokens 2048 --ks 64
    .venv/bin/python benchmarks/bench_topk_kl.py --device cuda --dtype bf16 --tokens 2048,8192   # one GPU command

Timed on the same (tokens, vocab) logits, forward + backward to the logits, interleaved rounds, median:

* `logprob`: verl's `verl.utils.torch_functional.logprobs_from_logits` of the sampled token, called as verl's FSDP
  engine calls it (`(total_nnz, V)` logits; on CPU verl takes its row-by-row `logsumexp` loop for fp32, on a GPU
  flash-attn's cross-entropy when installed);
* `fused`: torch's one-call `cross_entropy` of the same tokens (a tighter CPU reference than verl's row loop);
* `topk`: `rpg.topk_kl.topk_kl` (chunked log-sum-exp over the vocabulary, gather at S, analytic KL with the bucket
  tail) at a support S fixed beforehand (k = 16, 64, 256; the support's selection runs in the old-log-prob pass and
  is not timed here).

Printed: milliseconds, `topk/logprob` and `topk/fused` ratios, the support's bytes per step ((tokens, k) int32 ids +
fp32 log-probs) and, on CUDA, the peak memory above the logits and their gradient. Then the gradient variance of the
estimators on the exact toy of tests/topk_toy.py (Σ_y μ(y)·‖∇loss(y) − E∇‖², V = 5, 3 steps, frozen reference).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rpg import topk_kl as tk  # noqa: E402 (torch only)

try:
    from verl.utils.torch_functional import logprobs_from_logits

    LOGPROB_SOURCE = "verl.utils.torch_functional.logprobs_from_logits"
except ImportError:  # the GPU check machine has torch and transformers only (scripts/gpu_check.sh)
    LOGPROB_SOURCE = "verl absent: its no-flash-attn branch (logprobs_from_logits_v2's row loop) restated here"

    def logprobs_from_logits(logits, labels):
        """verl 0.9.1's `logprobs_from_logits` without flash-attn: one row at a time, `logsumexp` for fp32/fp64,
        `log_softmax` for bf16/fp16."""
        if logits.dtype in (torch.float32, torch.float64):
            picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            return picked - torch.stack([torch.logsumexp(row, -1) for row in logits])
        return torch.stack([torch.log_softmax(r, -1)[t] for r, t in zip(logits, labels, strict=True)])

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn, logits, device):
    """(seconds, peak bytes above the start on CUDA) of fn(logits).sum() and its gradient to the logits."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    _sync(device)
    t0 = time.perf_counter()
    out = fn(logits)
    (g,) = torch.autograd.grad(out.float().sum(), logits)
    _sync(device)
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - start if device == "cuda" else 0
    del g, out
    return dt, peak


def _topk_path(sup, args):
    return lambda z: tk.topk_kl(z, sup, args.direction, "bucket", chunk_tokens=args.chunk).kl


def bench_case(tokens, vocab, ks, args):
    g = torch.Generator(device=args.device).manual_seed(0)
    base = 2.0 * torch.randn(tokens, vocab, generator=g, device=args.device)
    logits = base.to(dtype=DTYPES[args.dtype]).requires_grad_(True)
    old = base + 0.3 * torch.randn(tokens, vocab, generator=g, device=args.device)
    labels = torch.multinomial(torch.softmax(old[:, :4096], -1), 1).squeeze(1)  # the cost does not depend on them
    del base
    paths = {
        "logprob": lambda z: logprobs_from_logits(logits=z, labels=labels),
        "fused": lambda z: -torch.nn.functional.cross_entropy(z.float(), labels, reduction="none"),
    }
    supports = {}
    for k in ks:
        sup = tk.select_support(old, k, chunk_tokens=args.chunk)
        supports[k] = sup
        paths[f"topk{k}"] = _topk_path(sup, args)
    del old
    for fn in paths.values():  # warm-up
        _timed(fn, logits, args.device)
    times = {n: [] for n in paths}
    peaks = {n: 0 for n in paths}
    for r in range(args.repeats):
        order = list(paths) if r % 2 == 0 else list(reversed(paths))
        for n in order:
            dt, peak = _timed(paths[n], logits, args.device)
            times[n].append(dt)
            peaks[n] = max(peaks[n], peak)
    med = {n: statistics.median(v) for n, v in times.items()}
    peak = f", peak +{peaks['logprob'] / 2**20:.0f} MiB" if args.device == "cuda" else ""
    print(f"\ntokens={tokens} vocab={vocab} {args.dtype} {args.device}: logprob {1e3 * med['logprob']:.1f} ms, "
          f"fused {1e3 * med['fused']:.1f} ms{peak}")  # fmt: skip
    print(f"  {'k':>4s} {'topk ms':>9s} {'topk/logprob':>13s} {'topk/fused':>11s} {'support MiB':>12s}"
          + (f" {'peak MiB':>9s}" if args.device == "cuda" else ""))  # fmt: skip
    for k in ks:
        n = f"topk{k}"
        sup_bytes = supports[k].ids.numel() * 4 + supports[k].log_probs.numel() * 4
        line = (f"  {k:4d} {1e3 * med[n]:9.1f} {med[n] / med['logprob']:13.2f} {med[n] / med['fused']:11.2f} "
                f"{sup_bytes / 2**20:12.2f}")  # fmt: skip
        if args.device == "cuda":
            line += f" {peaks[n] / 2**20:9.0f}"
        print(line)


def toy_variances():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import topk_toy as tt
    from kl_toy import ARToy

    toy, beta, v = ARToy(seed=1, steps=3, vocab=5), 1.0, 5
    print("\ngradient variance on the toy (V = 5, 3 steps, off-policy, frozen reference, β = 1; "
          "Σ_y μ(y)·‖g(y) − E g‖²):")  # fmt: skip
    print(f"  {'direction':9s} {'sampled (RPG)':>14s} {'top-k S=V':>10s} {'k=2 sampled tail':>17s} "
          f"{'k=2 bucket*':>12s} "
          f"{'w·analytic S=V':>15s} {'w·analytic k=2':>15s}")  # fmt: skip
    for d in tk.DIRECTIONS:
        var = lambda grads: tt.gradient_variance(toy, grads)  # noqa: E731
        row = [
            var(tt.sampled_estimator_gradients(toy, d, "frozen", beta)),
            var(tt.per_sample_gradients(toy, d, "sampled", "frozen", v, beta)),
            var(tt.per_sample_gradients(toy, d, "sampled", "frozen", 2, beta)),
            var(tt.per_sample_gradients(toy, d, "bucket", "frozen", 2, beta)),
            var(tt.per_sample_gradients(toy, d, "sampled", "frozen", v, beta, mutant="w_times_analytic")),
            var(tt.per_sample_gradients(toy, d, "sampled", "frozen", 2, beta, mutant="w_times_analytic")),
        ]
        print(f"  {d:9s} " + " ".join(f"{x:{w}.4f}" for x, w in zip(row, (14, 10, 17, 12, 15, 15))))
    print("  (* biased: the bucket tail's gradient bias is documented in docs/losses.md#topk-kl)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    ap.add_argument("--vocab", default="32000,151936", help="comma-separated vocabulary sizes")
    ap.add_argument("--tokens", default=None,
                    help="comma-separated token counts (default: 512 for 32k, 128 above; the issue's sizes go to 2048)")
    ap.add_argument("--ks", default="16,64,256")
    ap.add_argument("--direction", default="reverse", choices=list(tk.DIRECTIONS))
    ap.add_argument("--chunk", type=int, default=tk.DEFAULT_CHUNK_TOKENS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--no-toy", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s)"
          + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else "")
          + f"; logprob = {LOGPROB_SOURCE}")  # fmt: skip
    for vocab in (int(v) for v in args.vocab.split(",")):
        token_list = args.tokens.split(",") if args.tokens else ["512" if vocab <= 32768 else "128"]
        for tokens in (int(t) for t in token_list):
            bench_case(tokens, vocab, ks, args)
    if not args.no_toy:
        toy_variances()


if __name__ == "__main__":
    main()
