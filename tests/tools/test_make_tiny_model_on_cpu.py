"""rpg.tools.tiny_model: task format vs verl's math_dapo scorer, verl data schema, determinism, idempotence.

Builds with a 10-step SFT budget into a temporary folder (about 20 s for three builds).
"""

import random

import pandas as pd
import pytest

from rpg.tools import tiny_model as mtm

QUICK = ["--max-steps", "10", "--eval-every", "5", "--target", "0.9,1.0", "--n-train", "300"]


def test_solutions_are_scored_correct_by_verls_math_dapo_scorer():
    from verl.utils.reward_score import default_compute_score

    rng = random.Random(3)
    for _ in range(20):
        a, b = mtm.make_problem(rng)
        text = mtm.solution_text(a, b)
        assert default_compute_score("math_dapo", text, str(a + b))["score"] == 1.0
        assert default_compute_score("math_dapo", text, str(a + b + 1))["score"] == -1.0
        assert mtm.is_correct(text, a + b) and not mtm.is_correct(text, a + b + 1)
    assert mtm.solution_text(123, 45) == "3+5+0=8\n2+4+0=6\n1+0+0=1\nAnswer: 168"
    assert mtm.solution_text(99, 99) == "9+9+0=18\n9+9+1=19\nAnswer: 198"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "tiny"
    assert mtm.main(["--out", str(out), *QUICK]) == 0
    return out


def test_outputs_follow_verl_schema_and_hold_out_validation(built):
    from transformers import AutoTokenizer

    train, val = pd.read_parquet(built / "train.parquet"), pd.read_parquet(built / "val.parquet")
    assert len(train) == 300 and len(val) == 200
    row = train.iloc[0]
    assert row["data_source"] == "math_dapo" and row["ability"] == "math"
    assert row["reward_model"]["style"] == "rule"
    a, b = int(row["extra_info"]["a"]), int(row["extra_info"]["b"])
    assert row["reward_model"]["ground_truth"] == str(a + b)
    assert list(row["prompt"]) == [{"role": "user", "content": mtm.prompt_text(a, b)}]
    pairs = lambda df: {(int(e["a"]), int(e["b"])) for e in df["extra_info"]}  # noqa: E731
    assert not pairs(train) & pairs(val)
    tok = AutoTokenizer.from_pretrained(built / "model")
    rendered = tok.apply_chat_template([{"role": "user", "content": mtm.prompt_text(a, b)}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == mtm.render_prompt(a, b)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert all(len(tok.tokenize(d)) == 1 for d in "0123456789")


def test_idempotent_and_deterministic(built, tmp_path, capsys):
    stamp = (built / "model" / "model.safetensors").stat().st_mtime_ns
    assert mtm.main(["--out", str(built), *QUICK]) == 0
    assert "up to date" in capsys.readouterr().out
    assert (built / "model" / "model.safetensors").stat().st_mtime_ns == stamp
    again = tmp_path / "again"
    assert mtm.main(["--out", str(again), *QUICK]) == 0
    assert (again / "model" / "model.safetensors").read_bytes() == (built / "model" / "model.safetensors").read_bytes()
    assert mtm.main(["--out", str(again), *QUICK, "--seed", "1"]) == 0  # other settings: rebuilt in place
    assert (again / "model" / "model.safetensors").read_bytes() != (built / "model" / "model.safetensors").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left behind


def test_bad_target_is_named(capsys):
    with pytest.raises(SystemExit) as exc:
        mtm.parse_args(["--target", "0.6,0.2"])
    assert exc.value.code == 2
    assert "--target needs 0 <= LO <= HI <= 1, got '0.6,0.2'" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["user_folder", "user_file_in_own_build"])
def test_never_deletes_files_it_did_not_create(built, tmp_path, capsys, layout):
    """An --out folder with files the tool did not write is refused, naming the folder; nothing is deleted."""
    if layout == "user_folder":
        out = tmp_path / "mine"
        (out / "sub").mkdir(parents=True)
        (out / "notes.txt").write_text("keep me")
        (out / "sub" / "data.bin").write_bytes(b"\x00")
        keep = {"notes.txt": b"keep me", "sub/data.bin": b"\x00"}
    else:  # a copy of a real build with a user's file added to model/
        import shutil

        out = tmp_path / "tiny"
        shutil.copytree(built, out)
        (out / "model" / "README.md").write_text("my notes")
        weights = (built / "model" / "model.safetensors").read_bytes()
        keep = {"model/README.md": b"my notes", "model/model.safetensors": weights}
    assert mtm.main(["--out", str(out), *QUICK, "--seed", "7"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} " in err and "not created by rpg-tiny-model" in err, err
    for rel, data in keep.items():
        assert (out / rel).read_bytes() == data
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_out_may_be_an_existing_empty_folder_but_not_a_file(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert mtm.main(["--out", str(empty), *QUICK, "--max-steps", "0", "--n-train", "10"]) == 0
    assert (empty / "model" / "config.json").is_file()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert mtm.main(["--out", str(a_file), *QUICK]) == 2
    assert f"--out {a_file} is not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "x"


def test_sigterm_during_the_build_removes_the_temporary_folder(tmp_path):
    """A real SIGTERM while the model trains: exit 143, neither the temporary folder nor a partial --out remains."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "tiny"
    cmd = [sys.executable, "-m", "rpg.tools.tiny_model", "--out", str(out)]
    cmd += ["--max-steps", "99999", "--eval-every", "99999"]  # SFT that runs until the signal
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    # the build announces its SFT warm-up once the temporary folder exists and the model is built: poll for it
    printed, deadline = "", time.time() + 120
    while "SFT warm-up" not in printed and proc.poll() is None and time.time() < deadline:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            printed += proc.stdout.readline()
    assert "SFT warm-up" in printed, f"the build never reached its SFT warm-up: {printed!r}"
    assert [p.name[:6] for p in tmp_path.iterdir()] == [".tiny."], "the build folder never appeared"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143
    proc.stdout.close()
    assert list(tmp_path.iterdir()) == []


def test_concurrent_builds_of_one_folder_build_once(tmp_path):
    """Two processes asking for the same --out at once (two test workers, two shells): one builds, the other waits
    for it and finds the build up to date; neither replaces the folder under the other's feet."""
    import subprocess
    import sys

    out = tmp_path / "tiny"
    cmd = [sys.executable, "-m", "rpg.tools.tiny_model", "--out", str(out), *QUICK, "--max-steps", "0",
           "--n-train", "10"]  # fmt: skip
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    printed = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], printed
    wrote = [text for text in printed if "[tiny_model] wrote" in text]
    assert len(wrote) == 1 and sum("[tiny_model] up to date" in text for text in printed) == 1, printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # no lock file or temporary folder left
