"""rpg-evaluate (rpg/tools/evaluate.py) on the offline tiny model: metrics, de-duplication, prompt rendering, the
hf engine end to end, seeding, the checkpoint forms (HF dir, verl FSDP checkpoint merged by verl's model merger,
trainer checkpoint root) and bad input. About 1 min (the FSDP checkpoint is written by verl's actor worker in a
subprocess, ~25 s)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rpg.tools import evaluate as ev

HERE = Path(__file__).resolve().parent
INSTRUCTION = "The last line of your response should be of the form Answer: $Answer"
WRONG = "-1"  # a ground truth no sum can have: that problem scores 0 on every sample


def row(a, b, source="math_dapo", truth=None, index=0):
    return {"data_source": source, "prompt": [{"role": "user", "content": f"What is {a} + {b}? {INSTRUCTION}"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": truth or str(a + b)},
            "extra_info": {"index": index}}


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return str(tiny_dir / "model")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A: 37+48 three times, 123+456 twice, 500+250 with a wrong ground truth once (math_dapo); B: 37+48 once as
    data source aime_tiny (routed to the math_dapo scorer by its prefix)."""
    d = tmp_path_factory.mktemp("eval_data")
    a = write_parquet(d / "a.parquet", [row(37, 48, index=i) for i in range(3)] + [row(123, 456, index=i)
                                                                                  for i in range(2)]
                      + [row(500, 250, truth=WRONG)])
    b = write_parquet(d / "b.parquet", [row(37, 48, source="aime_tiny")])
    return [a, b]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared; decoding a tiny model is fastest on one thread
    yield
    torch.set_num_threads(threads)


SETTINGS = ev.SamplingSettings(k=4, max_tokens=48, max_prompt_length=48)


def read_samples(out):
    return [json.loads(line) for line in (Path(out) / "samples.jsonl").read_text().splitlines()]


# ---- pure functions ------------------------------------------------------------------------------------------------
def test_summarize_hand_computed():
    acc = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]]  # per-problem means 0.5, 0, 1
    s = ev.summarize(acc)
    assert s["mean@k"] == pytest.approx(0.5)
    assert s["best@k"] == pytest.approx(2 / 3)  # two problems with at least one correct sample
    assert s["se"] == pytest.approx(0.5 / math.sqrt(3))  # sd(0.5, 0, 1) = 0.5
    assert s["se_sampling"] == pytest.approx(math.sqrt((1 / 3) / 4) / 3)  # var(1,0,0,1) = 1/3, the others 0
    assert (s["n_problems"], s["n_samples"]) == (3, 12)
    one = ev.summarize([[1.0]])
    assert (one["mean@k"], one["best@k"], one["se"], one["se_sampling"]) == (1.0, 1.0, None, None)


def test_read_problems_dedupes_repeated_rows(files):
    problems, stats = ev.read_problems(files)
    assert [(p.data_source, p.ground_truth, p.rows) for p in problems] == [
        ("math_dapo", "85", 3), ("math_dapo", "579", 2), ("math_dapo", WRONG, 1), ("aime_tiny", "85", 1)]
    assert stats == [{"path": files[0], "rows": 6, "problems": 3}, {"path": files[1], "rows": 1, "problems": 1}]


def test_render_prompts_as_verl_and_left_truncation(tiny, files):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    problems, _ = ev.read_problems(files[:1])
    full, truncated = ev.render_prompts(problems, tokenizer, "qwen2", SETTINGS)
    expected = [tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False) for p in problems]
    assert full == expected and truncated == [False] * 3
    assert tokenizer.decode(full[0]).endswith("<|im_start|>assistant\n")
    short, truncated = ev.render_prompts(problems, tokenizer, "qwen2", ev.SamplingSettings(max_prompt_length=10))
    assert short == [ids[-10:] for ids in expected] and truncated == [True] * 3


# ---- the hf engine end to end --------------------------------------------------------------------------------------
def test_tiny_model_end_to_end(tiny, files, tmp_path, capsys):
    rc = ev.main(["--model", tiny, "--data", *files, "--out", str(tmp_path), "--k", "4", "--max-tokens", "48",
                  "--max-prompt-length", "48", "--engine", "hf", "--save-samples"])
    assert rc == 0
    results = json.loads((tmp_path / "results.json").read_text())
    samples = read_samples(tmp_path)
    assert len(samples) == 4 * 4 and not list(tmp_path.glob(".*"))  # no temporary file left behind
    # acc is the training routing's; check it against the task's own rule: the last "Answer:" line equals a + b
    for s in samples:
        found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", s["response"])
        assert s["acc"] == float(bool(found) and found[-1].strip() == s["ground_truth"])
        assert s["response_tokens"] <= 48
    by_problem = {}
    for s in samples:
        by_problem.setdefault((s["data_source"], s["problem"]), []).append(s)
    assert [s["acc"] for s in by_problem[("math_dapo", 2)]] == [0.0] * 4  # the wrong ground truth
    assert any(len({s["response"] for s in group}) > 1 for group in by_problem.values())  # k independent samples
    # one prompt, one seed stream: 37+48 gets the same responses under both data sources
    assert [s["response"] for s in by_problem[("math_dapo", 0)]] == [s["response"] for s in by_problem[("aime_tiny", 3)]]
    for source, n in (("math_dapo", 3), ("aime_tiny", 1)):
        acc = [[s["acc"] for s in group] for (src, _), group in by_problem.items() if src == source]
        r = results["results"][source]
        assert (r["n_problems"], r["n_samples"], r["truncated_prompts"]) == (n, 4 * n, 0)
        assert r["mean@k"] == pytest.approx(sum(map(sum, acc)) / (4 * n))
        assert r["best@k"] == pytest.approx(sum(max(a) for a in acc) / n)
    assert results["sampling"] == {"k": 4, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 48,
                                   "max_prompt_length": 48, "seed": 0, "chat_template_kwargs": {}}
    assert results["engine"] == "hf" and results["model"]["kind"] == "hf_dir"
    assert [f["problems"] for f in results["files"]] == [3, 1]
    table = (tmp_path / "results.md").read_text()
    assert "| data source | problems | samples | mean@4 | s.e. | best@4 |" in table
    assert f"| math_dapo | 3 | 12 | {results['results']['math_dapo']['mean@k']:.4f} |" in table
    assert table in capsys.readouterr().out


def test_reproducible_for_a_seed(tiny, files, tmp_path):
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        ev.evaluate(tiny, files[:1], tmp_path / name, ev.SamplingSettings(k=4, max_tokens=48, max_prompt_length=48,
                                                                          seed=seed), engine="hf", save_samples=True)
        runs[name] = [s["response"] for s in read_samples(tmp_path / name)]
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_greedy_and_response_budget(tiny, files, tmp_path):
    settings = ev.SamplingSettings(k=3, temperature=0.0, max_tokens=6, max_prompt_length=48)
    results = ev.evaluate(tiny, files[:1], tmp_path, settings, engine="hf", batch_size=4, save_samples=True)
    samples = read_samples(tmp_path)
    for i in range(3):
        assert len({s["response"] for s in samples if s["problem"] == i}) == 1  # greedy: k identical samples
    assert all(s["response_tokens"] == 6 for s in samples)  # a correct answer needs 22+ tokens: the budget stops it
    assert results["results"]["math_dapo"]["mean@k"] == 0.0


# ---- checkpoint forms ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt_root(tiny, tmp_path_factory):
    """A trainer checkpoint root written by verl's FSDP actor worker (no training step: the tiny model's weights)."""
    root = tmp_path_factory.mktemp("ckpts")
    subprocess.run([sys.executable, str(HERE / "fsdp_checkpoint.py"), tiny, str(root), "5"], check=True,
                   capture_output=True, timeout=300)
    return root


def test_resolve_checkpoint_forms(tiny, ckpt_root, tmp_path):
    actor = ckpt_root / "global_step_5" / "actor"
    for arg in (ckpt_root, ckpt_root / "global_step_5", actor):
        assert ev.resolve_model(str(arg)) == ev.ResolvedModel("verl_fsdp", None, str(actor), 5)
    assert ev.resolve_model(tiny) == ev.ResolvedModel("hf_dir", tiny)
    assert ev.resolve_model("Qwen/Qwen3-4B") == ev.ResolvedModel("hub_id", "Qwen/Qwen3-4B")  # never downloaded here
    # huggingface/ with the full weights (checkpoint.save_contents with hf_model) is loaded as is
    copy = tmp_path / "global_step_7" / "actor"
    shutil.copytree(actor, copy)
    shutil.copy(Path(tiny) / "model.safetensors", copy / "huggingface")
    assert ev.resolve_model(str(copy)) == ev.ResolvedModel("verl_fsdp_hf", str(copy / "huggingface"), str(copy), 7)
    with pytest.raises(ev.EvaluateError, match="no weights.*pass its actor/ directory"):
        ev.resolve_model(str(actor / "huggingface"))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("9")
    with pytest.raises(ev.EvaluateError, match="names step '9'.*does not exist"):
        ev.resolve_model(str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ev.EvaluateError, match="not a Hugging Face model directory"):
        ev.resolve_model(str(tmp_path / "empty"))
    with pytest.raises(ev.EvaluateError, match="no such file or directory"):
        ev.resolve_model(str(tmp_path / "missing"))


def test_fsdp_checkpoint_equals_its_hf_model(tiny, files, ckpt_root, tmp_path):
    """Merged by verl's model merger, the checkpoint is the tiny model: the same seed gives the same samples."""
    ev.evaluate(tiny, files[:1], tmp_path / "hf", SETTINGS, engine="hf", save_samples=True)
    results = ev.evaluate(str(ckpt_root), files[:1], tmp_path / "ckpt", SETTINGS, engine="hf", save_samples=True)
    assert results["model"] == {"arg": str(ckpt_root), "kind": "verl_fsdp", "path": None,
                                "checkpoint": str(ckpt_root / "global_step_5" / "actor"), "step": 5}
    assert read_samples(tmp_path / "ckpt") == read_samples(tmp_path / "hf")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["results.json", "results.md", "samples.jsonl"]
    merged = tmp_path / "merged"
    results = ev.evaluate(str(ckpt_root), files[:1], tmp_path / "kept", SETTINGS, engine="hf", merged_dir=str(merged))
    assert results["model"]["path"] == str(merged) and ev.resolve_model(str(merged)).kind == "hf_dir"


# ---- bad input -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--k", "0"], "--k=0 is not valid; use a positive integer"),
    (["--top-p", "0"], "--top-p=0.0 is not valid; use in (0, 1]"),
    (["--top-k", "0"], "--top-k=0 is not valid; use -1 (off) or a positive integer"),
    (["--temperature", "-1"], "--temperature=-1.0 is not valid"),
    (["--max-tokens", "0"], "--max-tokens=0 is not valid"),
    (["--batch-size", "0"], "--batch-size=0 is not valid"),
    (["--data", "missing.parquet"], "--data missing.parquet: no such file"),
    (["--model", "./nowhere"], "--model ./nowhere: no such file or directory"),
])
def test_bad_input_is_named_before_loading_a_model(args, message, tiny, files, tmp_path, capsys):
    argv = ["--model", tiny, "--data", files[0], "--out", str(tmp_path / "out"), *args]  # the last value wins
    assert ev.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_files_and_sources(tmp_path, tiny):
    text = tmp_path / "a.jsonl"
    text.write_text("{}\n")
    no_truth = write_parquet(tmp_path / "t.parquet", [{**row(1, 2), "reward_model": {"style": "rule"}}])
    bad_source = write_parquet(tmp_path / "s.parquet", [row(1, 2, source="no-such-source")])
    cases = [(str(text), "unsupported file type '.jsonl'; valid: .parquet"),
             (no_truth, "t.parquet: row 1: missing field 'reward_model.ground_truth'"),
             (bad_source, "data_source 'no-such-source' has no scorer")]
    for path, message in cases:
        with pytest.raises(ev.EvaluateError, match=re.escape(message)):
            ev.evaluate(tiny, [path], tmp_path / "out", SETTINGS, engine="hf")


@pytest.mark.skipif(ev.importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_engine_without_vllm(tiny, files, tmp_path):
    with pytest.raises(ev.EvaluateError, match="vllm is not installed.*--engine hf"):
        ev.evaluate(tiny, files, tmp_path, SETTINGS, engine="vllm")
    assert ev.default_engine() == "hf"
