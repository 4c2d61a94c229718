"""A worker's task thread keeps its database connection from one task to the next
(``CELERY_DB_REUSE_MAX``: Celery's Django fixup closed it before and after every task, so
each chat opened one of its own), checked around each task as Django checks a request's
(``gpu_worker.serving.signals``): one older than ``DB_CONN_MAX_AGE``, or broken, goes."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection, connections

from config.celery import app
from gpu_worker.serving import signals

pytestmark = pytest.mark.django_db(transaction=True)


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def around_a_task(fixup: DjangoWorkerFixup) -> None:
    """What the worker runs around a task, as the signals run it: the fixup's handlers,
    then ours (``signals``)."""
    task = SimpleNamespace(request=SimpleNamespace(is_eager=False))
    fixup.on_task_prerun(task)
    signals._old_connections(task)
    fixup.on_task_postrun(task)
    signals._old_connections(task)


def test_a_tasks_connection_is_kept_until_it_is_old_or_broken():
    fixup = DjangoWorkerFixup(app)
    assert fixup.db_reuse_max  # without it, the fixup closes every connection per task
    first = backend_pid()
    connection.close_at = time.monotonic() + 60  # as DB_CONN_MAX_AGE 60 opened it
    around_a_task(fixup)
    assert backend_pid() == first  # the next task's query: the same server connection
    connection.close_at = time.monotonic() - 1  # past DB_CONN_MAX_AGE
    around_a_task(fixup)
    second = backend_pid()
    assert second != first
    connection.close_at = time.monotonic() + 60
    other = connections.create_connection("default")
    try:  # the server ends it (a restart, an administrator): broken for the worker
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [second])
    finally:
        other.close()
    around_a_task(fixup)
    assert backend_pid() not in (first, second)  # found broken at its next use, replaced


def test_an_eager_tasks_caller_keeps_its_connection():
    first = backend_pid()
    connection.close_at = time.monotonic() - 1  # would be closed around a worker's task
    signals._old_connections(SimpleNamespace(request=SimpleNamespace(is_eager=True)))
    assert connection.connection is not None and backend_pid() == first
