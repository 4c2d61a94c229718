"""Deadlines on Postgres (config.settings DATABASES OPTIONS): a connect timeout, so a
server that accepts connections and never answers fails a new connection in time, and a
server-side statement timeout, so a runaway statement is cancelled (a JSON 503 outage).

The hung server is a throwaway cluster of the test's own whose postmaster is stopped with
SIGSTOP (and continued after): never the session's database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.db import OperationalError, connection, transaction

from tenants.faults import outage
from tests.throwaway import ThrowawayPostgres
from tests.workers import ROOT

BOUND_S = 60  # what a command may take at most against a hung server (a deadline)


@pytest.mark.django_db
def test_connections_carry_both_deadlines(settings):
    options = connection.settings_dict["OPTIONS"]
    assert options["connect_timeout"] == settings.DB_CONNECT_TIMEOUT > 0
    with connection.cursor() as cur:
        cur.execute("SHOW statement_timeout")
        assert cur.fetchone()[0] == f"{settings.DB_STATEMENT_TIMEOUT_MS // 1000}s"


@pytest.mark.django_db
def test_a_statement_past_its_timeout_is_cancelled_as_a_database_outage():
    with pytest.raises(OperationalError) as err, transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL statement_timeout = 100")
            cur.execute("SELECT pg_sleep(30)")
    assert "statement timeout" in str(err.value)
    assert outage(err.value) == "database"  # answered as the 503 of the error contract


def showmigrations(url: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": url,
           "DB_CONNECT_TIMEOUT": "2"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "manage.py", "showmigrations", "tenants"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=BOUND_S + 60)
    return out, time.monotonic() - started


@pytest.fixture
def throwaway_pg():
    pg = ThrowawayPostgres()
    yield pg
    pid = postmaster_pid(pg)
    if pid is not None:
        os.kill(pid, signal.SIGCONT)
    pg.cleanup()


def postmaster_pid(pg) -> int | None:
    try:
        return int((pg.server.pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def test_a_hung_postmaster_fails_a_new_connection_within_the_connect_timeout(throwaway_pg):
    assert showmigrations(throwaway_pg.url)[0].returncode == 0
    pid = postmaster_pid(throwaway_pg)
    os.kill(pid, signal.SIGSTOP)  # accepts connections (the kernel does), never answers
    try:
        out, took = showmigrations(throwaway_pg.url)
        assert out.returncode != 0, out.stdout
        assert "timeout" in out.stderr.lower(), out.stderr[-2000:]
        assert took < BOUND_S
    finally:
        os.kill(pid, signal.SIGCONT)
    assert showmigrations(throwaway_pg.url)[0].returncode == 0  # recovered by itself
