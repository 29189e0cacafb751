"""Forward+backward time of every RPG loss against verl's built-in `vanilla` loss on the same CPU tensors.

    .venv/bin/python benchmarks/bench_losses.py [--bs 32] [--T 2048] [--repeats 30] [--threads 1]

Each round times vanilla and every RPG loss once, in a shuffled order (interleaved, so drift and contention hit all
alike); the printed ratio is the median over rounds of t(loss)/t(vanilla) measured in the same round. Metrics are
on (the registered functions always compute them). A ratio ≤ 1.0 means no slower than vanilla.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import verl  # noqa: F401  (loads the rpg plugin through the verl.plugins entry point)
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.workers.config import ActorConfig

from rpg.loss_config import RPGPolicyLossConfig
from rpg.loss_table import LOSSES


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(args.bs, args.T, generator=g) * 3
    base_lp = old + 0.3 * torch.randn(args.bs, args.T, generator=g)
    adv = torch.randn(args.bs, 1, generator=g).expand(args.bs, args.T).contiguous()
    lengths = torch.randint(args.T // 4, args.T + 1, (args.bs,), generator=g)
    mask = torch.arange(args.T).unsqueeze(0) < lengths.unsqueeze(1)
    adv = adv * mask

    names = ["vanilla"] + sorted(n for n, spec in LOSSES.items() if not spec.needs_reference)
    configs = {
        n: ActorConfig(
            strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio_low=0.2, clip_ratio_high=0.28,
            clip_ratio_c=10.0, policy_loss=RPGPolicyLossConfig(loss_mode=n),
        )  # fmt: skip
        for n in names
    }

    def run(name):
        lp = base_lp.clone().requires_grad_(True)
        t0 = time.perf_counter()
        loss, metrics = POLICY_LOSS_REGISTRY[name](old, lp, adv, mask, "token-mean", configs[name], None)
        loss.backward()
        return time.perf_counter() - t0

    for n in names:  # warm-up
        run(n)
    times = {n: [] for n in names}
    ratios = {n: [] for n in names[1:]}
    rng = random.Random(0)
    for _ in range(args.repeats):
        order = names[:]
        rng.shuffle(order)
        round_t = {n: run(n) for n in order}
        for n in names:
            times[n].append(round_t[n])
        for n in names[1:]:
            ratios[n].append(round_t[n] / round_t["vanilla"])

    print(f"policy-loss forward+backward, {args.bs}x{args.T} tokens, fp32 CPU, {args.threads} thread(s), "
          f"{args.repeats} interleaved rounds")  # fmt: skip
    print(f"{'loss':32s} {'median ms':>10s} {'ratio vs vanilla (median)':>26s}")
    print(f"{'vanilla':32s} {1e3 * statistics.median(times['vanilla']):10.2f} {'1.00':>26s}")
    worst = 0.0
    for n in names[1:]:
        r = statistics.median(ratios[n])
        worst = max(worst, r)
        print(f"{n:32s} {1e3 * statistics.median(times[n]):10.2f} {r:26.2f}")
    print(f"worst median ratio: {worst:.2f}")


if __name__ == "__main__":
    main()
