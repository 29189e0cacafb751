"""Build the offline tiny model and toy task for CPU runs of the real verl trainer (demo, e2e test).

Everything is made locally, nothing is downloaded (docs/cpu.md#tiny-model):

* task: column-addition chain of thought for ``a + b`` with 10 <= a, b <= 999, answered on a last line
  ``Answer: N`` (the format verl's ``math_dapo`` scorer extracts: last ``Answer:`` match wins), e.g.::

      What is 37 + 48? The last line of your response should be of the form Answer: $Answer
      7+8+0=15
      3+4+1=8
      Answer: 85

* tokenizer: byte-level BPE with single-digit tokens, chatml chat template, eos ``<|im_end|>``, pad
  ``<|endoftext|>``;
* model: a 2-layer, hidden-128 ``Qwen2ForCausalLM`` (~0.57 M parameters, fp32);
* warm-up: SFT on freshly generated problems, evaluated every ``--eval-every`` steps on 200 held-out problems with
  sampling at T=1; the first checkpoint whose sampled accuracy lies in ``--target`` is kept, so RL starts from a
  policy that is right sometimes (~20-60 %) and has room to improve;
* data: ``train.parquet`` (held-out problems excluded) and ``val.parquet`` (the 200 held-out problems) in verl's
  RLHF schema with ``data_source="math_dapo"`` and ``reward_model.ground_truth``, so the default reward path
  (verl's math_dapo scorer, DAPO reward manager, ``algorithm.filter_groups``) is exercised unchanged.

Run it as ``rpg-tiny-model`` or ``python -m rpg.tools.tiny_model``. Output layout (``--out``, default
``artifacts/tiny`` in the working directory)::

    model/            HF model + tokenizer (actor_rollout_ref.model.path)
    train.parquet     data.train_files
    val.parquet       data.val_files
    build.json        the build settings and the SFT evaluation log

Idempotent: if ``build.json`` exists with the same settings, nothing is done (``--force`` rebuilds). The whole
folder is built in a temporary sibling and moved into place with ``os.replace`` (Ctrl-C and SIGTERM remove it).
Concurrent runs (two shells, parallel test workers) take turns: each holds an exclusive lock on ``--out``'s parent
folder while it checks and builds, so the second finds the first's build up to date instead of replacing it.
``--out`` may be new, an empty folder, or an earlier build of this tool: ``build.json`` lists every file the tool
wrote, and a folder holding anything else is refused, never deleted. Deterministic under ``--seed`` (one torch
thread).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

from rpg.atomic import atomic_write_json, replace_dir, shown, sibling_dir, sigterm_exits

INSTRUCTION = "The last line of your response should be of the form Answer: $Answer"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
HELD_OUT_SEED, TRAIN_DATA_SEED = 10_000, 1
BUILD_VERSION = 1  # bump when the output format or the recipe changes
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


# ---------------------------------------------------------------------------------------------------------- task --
def make_problem(rng: random.Random, lo: int = 10, hi: int = 999) -> tuple[int, int]:
    return rng.randint(lo, hi), rng.randint(lo, hi)


def prompt_text(a: int, b: int) -> str:
    return f"What is {a} + {b}? {INSTRUCTION}"


def solution_text(a: int, b: int) -> str:
    """Column addition from the least significant digit (``x+y+carry=s`` per column), then ``Answer: a+b``."""
    da, db = str(a)[::-1], str(b)[::-1]
    carry, lines = 0, []
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        lines.append(f"{x}+{y}+{carry}={s}")
        carry = s // 10
    lines.append(f"Answer: {a + b}")
    return "\n".join(lines)


def render_prompt(a: int, b: int) -> str:
    """The chat-templated prompt (identical to ``apply_chat_template(..., add_generation_prompt=True)``)."""
    return f"{BOS}user\n{prompt_text(a, b)}{EOS}\n{BOS}assistant\n"


def is_correct(response: str, answer: int) -> bool:
    """Same extraction as verl's math_dapo scorer: the last ``Answer:`` match, stripped, equals the answer."""
    found = _ANSWER.findall(response)
    return bool(found) and found[-1].strip().replace(" ", "") == str(answer)


def held_out_problems(n: int = 200) -> list[tuple[int, int]]:
    rng = random.Random(HELD_OUT_SEED)
    return [make_problem(rng) for _ in range(n)]


# ------------------------------------------------------------------------------------------------ tokenizer/model --
def build_tokenizer(seed: int, vocab_size: int = 384, n_texts: int = 20_000):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    texts = []
    for _ in range(n_texts):
        a, b = make_problem(rng)
        texts.append(render_prompt(a, b) + solution_text(a, b) + EOS + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None,
                                   unk_token=None, chat_template=CHAT_TEMPLATE, model_max_length=256,
                                   padding_side="left", additional_special_tokens=[BOS])


def build_model(tok, layers: int, hidden: int, seed: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    heads = max(1, hidden // 32)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=256,
                      rope_theta=10_000.0, tie_word_embeddings=True, bos_token_id=tok.convert_tokens_to_ids(BOS),
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, use_sliding_window=False)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = cfg.bos_token_id
    return model


# ------------------------------------------------------------------------------------------------------------ SFT --
def sft_batch(tok, rng: random.Random, batch_size: int, exclude: set):
    """Right-padded (ids, attention, labels); the loss covers the response and eos only."""
    import torch

    prompts, answers = [], []
    while len(prompts) < batch_size:
        a, b = make_problem(rng)
        if (a, b) not in exclude:
            prompts.append(render_prompt(a, b))
            answers.append(solution_text(a, b))
    p_ids = tok(prompts, add_special_tokens=False)["input_ids"]
    r_ids = tok(answers, add_special_tokens=False)["input_ids"]
    seqs = [p + r + [tok.eos_token_id] for p, r in zip(p_ids, r_ids)]
    length = max(map(len, seqs))
    ids = torch.full((batch_size, length), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((batch_size, length), -100, dtype=torch.long)
    att = torch.zeros((batch_size, length), dtype=torch.long)
    for i, (p, s) in enumerate(zip(p_ids, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        labels[i, len(p): len(s)] = torch.tensor(s[len(p):])
    return ids, att, labels


def evaluate(model, tok, problems, do_sample: bool, seed: int, max_new_tokens: int = 48) -> float:
    """Accuracy on ``problems`` (greedy, or sampled at T=1 with the full distribution); leaves the global RNG alone."""
    import torch

    model.eval()
    enc = tok([render_prompt(a, b) for a, b in problems], add_special_tokens=False, return_tensors="pt",
              padding=True)
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(**enc, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id, **sampling)
    model.train()
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(is_correct(t, a + b) for t, (a, b) in zip(texts, problems)) / len(problems)


def warm_up(model, tok, args, log) -> dict:
    """SFT until the sampled held-out accuracy first lands in [lo, hi]; returns the selected evaluation.

    If the window is never hit within ``--max-steps``, keeps the evaluated checkpoint closest to the window.
    """
    import torch

    lo, hi = args.target
    held = held_out_problems()
    exclude = set(held)
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    best, best_dist, best_state, evals = None, float("inf"), None, []
    t_start = time.time()
    model.train()
    for step in range(1, args.max_steps + 1):
        ids, att, labels = sft_batch(tok, rng, args.batch_size, exclude)
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % args.eval_every:
            continue
        sampled = evaluate(model, tok, held, do_sample=True, seed=args.seed + 1234)
        entry = dict(step=step, loss=round(loss.item(), 4), sampled_acc=sampled, seconds=round(time.time() - t_start, 1))
        evals.append(entry)
        log(f"[tiny_model] step {step}: loss {entry['loss']:.3f}, sampled held-out accuracy {sampled:.1%}")
        dist = max(lo - sampled, sampled - hi, 0.0)
        if dist < best_dist:
            best, best_dist = entry, dist
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if dist == 0.0:
            break
    if best_state is None:  # max_steps < eval_every: keep the last weights
        return {"selected": None, "evals": evals}
    model.load_state_dict(best_state)
    best = dict(best, greedy_acc=evaluate(model, tok, held, do_sample=False, seed=0))
    if best_dist > 0:
        log(f"[tiny_model] WARNING: sampled accuracy never reached [{lo:.0%}, {hi:.0%}]; using step "
            f"{best['step']} ({best['sampled_acc']:.1%})")
    return {"selected": best, "evals": evals}


# ----------------------------------------------------------------------------------------------------------- data --
def rl_rows(problems, split: str) -> list[dict]:
    """verl RLHFDataset rows: chat prompt, ``math_dapo`` data source, ground truth for the rule-based reward."""
    return [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": prompt_text(a, b)}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"index": i, "split": split, "a": a, "b": b}} for i, (a, b) in enumerate(problems)]


def write_data(out: Path, n_train: int) -> None:
    import pandas as pd

    held = held_out_problems()
    exclude, rng, train = set(held), random.Random(TRAIN_DATA_SEED), []
    while len(train) < n_train:
        problem = make_problem(rng)
        if problem not in exclude:
            train.append(problem)
    pd.DataFrame(rl_rows(train, "train")).to_parquet(out / "train.parquet")
    pd.DataFrame(rl_rows(held, "test")).to_parquet(out / "val.parquet")


# ----------------------------------------------------------------------------------------------------------- main --
def settings(args) -> dict:
    return dict(version=BUILD_VERSION, seed=args.seed, layers=args.layers, hidden=args.hidden, lr=args.lr,
                batch_size=args.batch_size, max_steps=args.max_steps, eval_every=args.eval_every,
                target=list(args.target), n_train=args.n_train)


def is_built(out: Path, wanted: dict) -> bool:
    manifest = out / "build.json"
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("settings") == wanted and \
            all((out / f).exists() for f in ("model/config.json", "train.parquet", "val.parquet"))
    except (OSError, ValueError):
        return False


class OutError(ValueError):
    """``--out`` is something the tool may not replace."""


def _tree(folder: Path) -> set[str]:
    """Every entry below ``folder`` (files, folders, links) as a relative POSIX path."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


def check_out(out: Path) -> None:
    """Refuse an ``--out`` the tool may not replace: it must be absent, an empty folder, or a folder holding exactly
    files of an earlier build (listed in its ``build.json``). Nothing the tool did not write is ever deleted."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutError(f"--out {out} is not a folder; choose a new or empty folder")
    entries = _tree(out) if out.exists() else set()
    if not entries:
        return
    try:
        files = json.loads((out / "build.json").read_text(encoding="utf-8"))["files"]
        own = {"build.json", *files} | {parent.as_posix() for f in files for parent in Path(f).parents} - {"."}
    except (OSError, ValueError, KeyError, TypeError):
        raise OutError(f"--out {out} is a folder not created by rpg-tiny-model (no build.json listing its files; "
                       "builds of earlier versions do not list them); refusing to replace it: choose a new or empty "
                       "folder, or remove it yourself") from None
    foreign = sorted(entries - own)
    if foreign:
        raise OutError(f"--out {out} holds files not created by rpg-tiny-model ({shown(foreign)}); refusing to "
                       "replace it: move them away or choose another folder")


def build(args, log=print) -> dict:
    """Build into a temporary sibling of ``args.out`` and move it into place; returns the manifest.

    Raises ``OutError`` (before any work, and again before the swap) if ``--out`` holds anything the tool did not
    write; an earlier build of the tool is replaced only when it holds nothing else.
    """
    import torch

    torch.set_num_threads(1)
    out = Path(args.out).absolute()
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_dir(out, "")
    try:
        t0 = time.time()
        tok = build_tokenizer(args.seed)
        model = build_model(tok, args.layers, args.hidden, args.seed)
        n_params = sum(p.numel() for p in model.parameters())
        log(f"[tiny_model] tokenizer: {len(tok)} tokens; model: {n_params} parameters; SFT warm-up ...")
        sft = warm_up(model, tok, args, log) if args.max_steps > 0 else {"selected": None, "evals": []}
        model.save_pretrained(tmp / "model")
        tok.save_pretrained(tmp / "model")
        write_data(tmp, args.n_train)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        manifest = dict(settings=settings(args), params=n_params, vocab=len(tok), sft=sft,
                        build_seconds=round(time.time() - t0, 1), files=files)
        atomic_write_json(tmp / "build.json", manifest, indent=1)  # written last: marks a complete build
        check_out(out)  # the build took minutes: look again right before the swap
        replace_dir(tmp, out)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def parse_args(argv=None):
    def window(text: str) -> tuple[float, float]:
        try:
            lo, hi = (float(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--target must be 'LO,HI' (fractions), got {text!r}")
        if not 0 <= lo <= hi <= 1:
            raise argparse.ArgumentTypeError(f"--target needs 0 <= LO <= HI <= 1, got {text!r}")
        return lo, hi

    ap = argparse.ArgumentParser(prog="rpg-tiny-model", description=__doc__.split("\n\n")[0],
                                 epilog="Layout and details: see the module docstring.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="artifacts/tiny", help="output folder")
    ap.add_argument("--seed", type=int, default=0, help="seed for tokenizer corpus, model init and SFT data")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3, help="SFT peak learning rate (AdamW, 50 warm-up steps)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-steps", type=int, default=800, help="SFT step budget (0: untrained model, for plumbing)")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--target", type=window, default=(0.25, 0.5),
                    help="stop at the first sampled held-out accuracy in [LO,HI]")
    ap.add_argument("--n-train", type=int, default=2000, help="RL training prompts")
    ap.add_argument("--force", action="store_true", help="rebuild even if an identical build exists")
    return ap.parse_args(argv)


@contextlib.contextmanager
def parent_locked(out: Path):
    """Hold an exclusive lock on ``out``'s parent folder (created if missing): no lock file is left behind, and the
    kernel releases the lock when the process dies."""
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if not args.force and is_built(out, settings(args)):  # the common case, without waiting for a lock
        print(f"[tiny_model] up to date: {out}")
        return 0
    try:
        with sigterm_exits(), parent_locked(out):  # SIGTERM removes the temporary build folder like Ctrl-C does
            if not args.force and is_built(out, settings(args)):  # built by another run while this one waited
                print(f"[tiny_model] up to date: {out}")
                return 0
            manifest = build(args)
    except OutError as e:
        print(f"[tiny_model] error: {e}", file=sys.stderr)
        return 2
    sel = manifest["sft"]["selected"]
    summary = (f"step {sel['step']}, sampled {sel['sampled_acc']:.1%}, greedy {sel['greedy_acc']:.1%}"
               if sel else "no SFT")
    print(f"[tiny_model] wrote {out} in {manifest['build_seconds']} s ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
