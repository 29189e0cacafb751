"""The loss path on a GPU: every RPG loss of the loss table on CUDA, in fp32 and bf16, against the same formulas in
float64 on the CPU, with extreme log-ratios and NaN/inf padding; then forward + backward time against the PPO clip.

    python benchmarks/gpu_loss_check.py                       # one GPU (scripts/gpu_check.sh runs it)
    python benchmarks/gpu_loss_check.py --device cpu --small  # no GPU: checks the script itself (a CPU test)

Needs torch only: `rpg.losses`' tensor functions import without verl (the GPU check machine has no verl), so this
calls them as the registered losses do (`rpg.losses.make_policy_loss`: the family function of each row with its
options) and aggregates with token-mean as verl's `agg_loss` does. The add-on rows (`rpg_kl_*`, verl's own loss plus
`rpg.kl_addon.kl_term`) are checked through their KL term.

Checked per loss and variant (iterative and frozen reference, the options that change the formula):
* value and gradient finite everywhere, exactly 0 on padding (which holds NaN and ±inf), metrics finite;
* the per-token loss and the gradient of the token-mean loss, on the device in `dtype`, against float64 on the CPU
  from the same inputs rounded to `dtype` (so only the computation's rounding is measured): the relative error
  max|x − x64| / max|x64| over the tokens with |log w| ≤ 1 (typical) and over all tokens (where the guard's ±60
  log-ratios make |x| reach 1e26, relative to the largest), over the tokens that took the same dual-clip branch in
  both; a token that took another branch (`flips`) must be explained by rounding: its w within 2^-6 (bf16) or 1e-5
  (fp32) of a clip boundary, or its branch sign (A' = A + C/w, Â) different, i.e. ≈ 0;
* time: the median forward + backward (+ the metrics' one host transfer) against the dual-clip PPO loss written
  inline (verl's `vanilla` formula; verl is not needed), same tensors, interleaved rounds.

Tolerances: fp32 1e-5 (typical) and 1e-4 (all); bf16 3e-2 (typical: bf16 keeps 8 significant bits, 2^-8 = 4e-3 per
rounding). A failed check prints FAIL and the script exits 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rpg import kl_addon  # noqa: E402 (torch only at import)
from rpg import losses as L  # noqa: E402
from rpg.loss_table import ADDON, FD, HARDCLIP, LOSSES  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOL = {"fp32": (1e-5, 1e-4), "bf16": (3e-2, None)}  # (typical, all); bf16's all-token error is printed only
BOUNDARY_TOL = {"fp32": 1e-5, "bf16": 2.0**-6}  # a branch flip is rounding where w is this close to a clip boundary
CLIP = L.ClipParams(eps_low=0.2, eps_high=0.28, c=3.0)
BETA = 0.1
EXTREMES = (30.0, -30.0, 80.0, -80.0, 700.0, -700.0)  # log w = lp − old at row 0 (finite: a log-softmax gives no ±inf)


def variants(spec):
    """(label, family keyword arguments, frozen reference?) of one loss-table row."""
    ref = (("frozen", True),) if spec.needs_reference else (("iterative", False), ("frozen", True))
    if spec.family == FD:
        extra = (("inside_clip", {"kl_placement": "inside_clip"}),)
        base = {"kl_placement": "additive"}
    elif spec.family == ADDON:
        return [(r, {}, f) for r, f in ref] + [("iterative, seq credit", {"kl_credit": "sequence"}, False)]
    else:
        base = {"branch_on": "effective_advantage", "kl_ratio": "clipped", "kl_credit": "token",
                "hard_clip": spec.family == HARDCLIP}  # fmt: skip
        extra = (("seq credit, raw w", dict(base, kl_credit="sequence", kl_ratio="raw")),)
    out = [(r, base, f) for r, f in ref]
    return out + [(f"iterative, {lab}", kw, False) for lab, kw in extra if not spec.needs_reference]


def inputs(bs: int, T: int, seed: int = 0):
    """float64 CPU tensors: log π_θ, log π_old, log π_ref, A (bs, T), the bool mask; extreme log-ratios at row 0 and
    NaN/±inf on padding."""
    g = torch.Generator().manual_seed(seed)
    old = -3.0 * torch.rand(bs, T, generator=g, dtype=torch.float64)
    lp = old + 0.3 * torch.randn(bs, T, generator=g, dtype=torch.float64)
    ref = old + 0.2 * torch.randn(bs, T, generator=g, dtype=torch.float64)
    adv = torch.randn(bs, 1, generator=g, dtype=torch.float64).expand(bs, T).contiguous()
    lengths = torch.randint(T // 2, T + 1, (bs,), generator=g)
    lengths[0] = T
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    for j, d in enumerate(EXTREMES):
        lp[0, j] = old[0, j] + d
        ref[0, j + len(EXTREMES)] = old[0, j + len(EXTREMES)] - d
    garbage = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=torch.float64)
    pad = ~mask
    idx = torch.arange(int(pad.sum())) % 3
    for t in (lp, old, ref, adv):
        t[pad] = garbage[idx]
    return lp, old, ref, adv, mask


def token_loss(spec, kw, lp, old, ref, adv, mask):
    """Per-token loss matrix and the TokenLoss/KLTerm (for the metrics) of one row, as the registered loss builds it."""
    div = spec.divergence
    if spec.family == ADDON:
        term = kl_addon.kl_term(lp, old, mask, div, BETA, ref_log_prob=ref, **kw)
        return term.loss, None
    fn = L.rpg_fully_differentiable if spec.family == FD else L.rpg_reinforce
    out = fn(lp, old, adv, mask, div, BETA, CLIP, ref_log_prob=ref, **kw)
    return out.loss, out


def run(spec, kw, frozen, tensors, device, dtype):
    lp, old, ref, adv, mask = (t.to(device) for t in tensors)
    lp, old, ref, adv = (t.to(dtype) for t in (lp, old, ref, adv))
    lp = lp.detach().requires_grad_(True)
    loss_mat, out = token_loss(spec, kw, lp, old, ref if frozen else None, adv, mask)
    loss = loss_mat.sum() / mask.sum()  # token-mean (verl's agg_loss)
    (grad,) = torch.autograd.grad(loss, lp)
    if out is None:  # the add-on's KL term: no branches
        stats, code, positive = torch.zeros(1), torch.zeros(mask.shape, dtype=torch.int8), mask
    else:
        stats, code, positive = L.metric_statistics(out, spec.divergence, BETA), out.branch, out.branches.positive
    return loss_mat.detach().double().cpu(), grad.double().cpu(), stats.cpu(), code.cpu(), positive.cpu()


def near_boundary(w: torch.Tensor, tol: float) -> torch.Tensor:
    """w within a relative `tol` of a clip boundary (1 − ε1, 1 + ε2, c)."""
    bounds = torch.tensor([1 - CLIP.eps_low, 1 + CLIP.eps_high, CLIP.c], dtype=w.dtype)
    return ((w.unsqueeze(-1) / bounds - 1).abs() <= tol).any(-1)


def rel_err(x, ref, sel):
    x, ref = x[sel], ref[sel]
    scale = ref.abs().max().clamp_min(1e-30)
    return float((x - ref).abs().max() / scale)


def check(args) -> bool:
    tensors = inputs(args.bs, args.T)
    lp, old = tensors[0], tensors[1]
    typical = tensors[4] & (lp - old).abs().le(1.0)
    ok = True
    print(f"{'loss':32s} {'variant':22s} {'dtype':5s} {'finite':6s} {'pad 0':5s} {'loss err':>9s} {'grad err':>9s} "
          f"{'loss err all':>12s} {'grad err all':>12s} {'flips':>6s}")  # fmt: skip
    for spec in LOSSES.values():
        for label, kw, frozen in variants(spec):
            for name in args.dtypes:
                dtype = DTYPES[name]
                rounded = [t.to(dtype).double() if t.is_floating_point() else t for t in tensors]
                ref_loss, ref_grad, _, ref_code, ref_pos = run(spec, kw, frozen, rounded, "cpu", torch.float64)
                loss_mat, grad, stats, code, pos = run(spec, kw, frozen, tensors, args.device, dtype)
                mask = tensors[4]
                finite = bool(loss_mat.isfinite().all() and grad.isfinite().all() and stats.isfinite().all())
                pad0 = bool((loss_mat[~mask] == 0).all() and (grad[~mask] == 0).all())
                # a token whose w sits on a clip boundary, or whose branch sign (A', Â) is ~0, may take the other
                # branch after rounding: its gradient then differs by w·A. Such flips are counted, not compared.
                w_ref = torch.exp(rounded[0] - rounded[1])
                flipped = mask & (code != ref_code)
                explained = (pos != ref_pos) | near_boundary(w_ref, BOUNDARY_TOL[name])
                unexplained = int((flipped & ~explained).sum())
                same = ~flipped
                errs = [rel_err(loss_mat, ref_loss, typical & same), rel_err(grad, ref_grad, typical & same),
                        rel_err(loss_mat, ref_loss, mask & same), rel_err(grad, ref_grad, mask & same)]  # fmt: skip
                tol_typ, tol_all = TOL[name]
                good = (finite and pad0 and unexplained == 0 and max(errs[:2]) <= tol_typ
                        and (tol_all is None or max(errs[2:]) <= tol_all))  # fmt: skip
                ok &= good
                print(f"{spec.name:32s} {label:22s} {name:5s} {str(finite):6s} {str(pad0):5s} "
                      + " ".join(f"{e:{w}.1e}" for e, w in zip(errs, (9, 9, 12, 12)))
                      + f" {int(flipped.sum()):6d}" + ("" if good else "  FAIL"))  # fmt: skip
    return ok


def vanilla(lp, old, adv, mask):
    """Dual-clip PPO, token-mean (verl's `vanilla` loss formula with clip 0.2/0.28, c = 3)."""
    ratio = torch.exp((lp - old).clamp(-20.0, 20.0))
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - CLIP.eps_low, 1 + CLIP.eps_high))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * CLIP.c), pg)
    return torch.where(mask, pg, 0.0).sum() / mask.sum()


def bench(args) -> None:
    g = torch.Generator().manual_seed(1)
    bs, T = args.bench_bs, args.bench_T
    old = (-3.0 * torch.rand(bs, T, generator=g)).to(args.device)
    lp0 = old + 0.3 * torch.randn(bs, T, generator=g).to(args.device)
    adv = torch.randn(bs, 1, generator=g).expand(bs, T).contiguous().to(args.device)
    mask = (torch.arange(T).unsqueeze(0) < torch.randint(T // 4, T + 1, (bs, 1), generator=g)).to(args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    def timed(fn):
        lp = lp0.detach().requires_grad_(True)
        sync()
        t0 = time.perf_counter()
        fn(lp)
        sync()
        return time.perf_counter() - t0

    def rpg_fn(spec):
        kw = variants(spec)[0][1]

        def f(lp):
            loss_mat, out = token_loss(spec, kw, lp, old, None, adv, mask)
            (loss_mat.sum() / mask.sum()).backward()
            if out is not None:
                L._metrics(out, spec.divergence, BETA)  # the registered path's one host transfer

        return f

    fns = {"vanilla": lambda lp: vanilla(lp, old, adv, mask).backward()}
    fns |= {s.name: rpg_fn(s) for s in LOSSES.values() if not s.needs_reference}
    for f in fns.values():
        timed(f)
    times = {n: [] for n in fns}
    for r in range(args.repeats):
        for n in list(fns) if r % 2 == 0 else list(reversed(fns)):
            times[n].append(timed(fns[n]))
    med = {n: statistics.median(v) for n, v in times.items()}
    print(f"\nforward + backward, {bs} × {T} fp32 on {args.device}, median of {args.repeats}: "
          f"vanilla (dual-clip PPO inline) {1e3 * med['vanilla']:.2f} ms")  # fmt: skip
    for n in fns:
        if n != "vanilla":
            print(f"  {n:32s} {1e3 * med[n]:8.2f} ms  {med[n] / med['vanilla']:5.2f}× vanilla")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="small sizes (the CPU test)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    args.dtypes = list(DTYPES)
    args.bs, args.T = (4, 32) if args.small else (16, 1024)
    args.bench_bs, args.bench_T = (4, 64) if args.small else (64, 4096)
    if args.small:
        args.repeats = 2
    if args.device == "cuda":
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    ok = check(args)
    bench(args)
    print(f"\n[loss check] {'PASS' if ok else 'FAIL'}: {len(LOSSES)} losses, fp32 and bf16 on {args.device} "
          "against float64 on the CPU")  # fmt: skip
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
