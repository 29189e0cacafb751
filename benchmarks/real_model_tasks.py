#!/usr/bin/env python
"""The base model's accuracy on the candidate tasks of rpg.data.tasks (docs/benchmarks.md#real-model).

    python benchmarks/real_model_tasks.py [--model artifacts/smollm2-135m] [--prompts 48] [--seed 0]
                                          [--tasks add1 sub1 mul1 add2 word1] [--threads 2]

For each task: ``--prompts`` problems of its validation split (rpg.data.tasks.split with ``--seed``), the model's chat
template, one response each sampled at temperature 1 (no top-k/top-p) with up to 48 new tokens (stopping at the
tokenizer's eos), then two scores per response: the paper's criterion (the last ``Answer:`` line, verl's
``math_dapo`` scorer as rpg.data.reward calls it) and the last number of the response (rpg.data.reward's
``last_number`` source, verl's GSM8K flexible extraction). Prints a Markdown table with the standard error of each
accuracy, the chance level (1 / the number of distinct answers) and the date, machine and seconds per task.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time

from rpg.data import reward, tasks


def stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def measure(model, tok, task: str, n: int, seed: int, max_new_tokens: int, greedy: bool = False) -> dict:
    """Accuracy of one sampled response per problem on ``n`` validation problems of ``task``."""
    import torch

    _, val = tasks.split(task, seed, n_val=n)
    chats = [[{"role": "user", "content": q}] for q, _ in val]
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    enc = tok(texts, add_special_tokens=False, return_tensors="pt", padding=True)
    t0 = time.time()
    with torch.no_grad():
        torch.manual_seed(seed)
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
        out = model.generate(**enc, **sampling, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    seconds = time.time() - t0
    responses = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    answer = sum(reward.math_dapo_score(r, str(a))["acc"] for r, (_, a) in zip(responses, val))
    last = sum(reward.last_number_score(r, str(a))["acc"] for r, (_, a) in zip(responses, val))
    return {"task": task, "n": n, "answer_acc": answer / n, "last_acc": last / n, "chance": tasks.chance(task),
            "prompt_tokens": max(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]),
            "seconds": round(seconds, 1), "example": responses[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="artifacts/smollm2-135m")
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", nargs="+", default=list(tasks.TASKS), choices=list(tasks.TASKS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling at T=1")
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rows = [measure(model, tok, t, args.prompts, args.seed, args.max_new_tokens, args.greedy) for t in args.tasks]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{now}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
          f"{args.threads}, model {args.model}, {args.prompts} prompts per task, seed {args.seed}, "
          f"{'greedy' if args.greedy else 'T=1'}, "
          f"{args.max_new_tokens} new tokens\n")
    print("| task | prompt tokens | `Answer:` line right | last number right (± s.e.) | chance | seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['task']}`: {tasks.TASKS[r['task']].holds} | {r['prompt_tokens']} | {r['answer_acc']:.0%} | "
              f"{r['last_acc']:.0%} ± {stderr(r['last_acc'], r['n']):.0%} | {r['chance']:.0%} | {r['seconds']} |")
    for r in rows:
        print(f"\n{r['task']} first response: {r['example']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
