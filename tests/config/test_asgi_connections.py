"""The web process (config/asgi.py) keeps no persistent database connections, whatever
DB_CONN_MAX_AGE says: under ASGI a request's sync code runs in threads that come and go,
each of which left its connection open (16 streaming clients held up to 82 of Postgres's
100 connections and a burst beside them was refused); it takes them from a bounded pool
of the process instead (DB_POOL), so a request no longer opens one of its own. A worker
keeps DB_CONN_MAX_AGE and no pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.workers import ROOT

PROBE = ("import os, sys, json; sys.argv = ['probe']; import {module}; "
         "from django.conf import settings; d = settings.DATABASES['default']; "
         "print(json.dumps([d['CONN_MAX_AGE'], d['OPTIONS'].get('pool')]))")

# Ten requests one after the other, each on a thread of its own as Django runs an ASGI
# request's sync code, each closing its connection when it ends (request_finished)
REQUESTS = """
import json, sys, threading
sys.argv = ['probe']
import config.asgi
from django.db import close_old_connections, connection

pids = []
def request():
    close_old_connections()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pids.append(cursor.fetchone()[0])
    close_old_connections()
for _ in range(10):
    t = threading.Thread(target=request)
    t.start()
    t.join()
print(json.dumps([pids, connection.pool.get_stats()["pool_max"]]))
"""


def _run(code: str, **env: str) -> list:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DB_CONN_MAX_AGE": "60",
           **env}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_web_process_pools_its_connections_and_the_worker_keeps_its_setting():
    age, pool = _run(PROBE.format(module="config.asgi"))
    assert age == 0 and pool["max_size"] == 20 and pool["min_size"] == 2
    assert _run(PROBE.format(module="config.asgi"), DB_POOL="0") == [0, None]
    assert _run(PROBE.format(module="config.settings")) == [60, None]


@pytest.mark.django_db
def test_requests_of_the_web_process_reuse_one_pooled_connection():
    from django.db import connection

    from tests.workers import database_url_from_settings

    url = database_url_from_settings(connection.settings_dict)
    pids, most = _run(REQUESTS, DATABASE_URL=url, DB_POOL_MAX_SIZE="2", DB_POOL_MIN_SIZE="1")
    assert most == 2 and len(pids) == 10
    # ten requests, each on a new thread, ran on at most the pool's two server connections
    # (without the pool: ten connections, one per request)
    assert len(set(pids)) <= 2


# A blocking chat waits for its worker without holding a pooled connection: with a pool of
# one, a second request's query runs (within DB_POOL_TIMEOUT) while the first one waits
WAITING = """
import json, sys, threading
sys.argv = ['probe']
import config.asgi
from django.db import close_old_connections, connection
from gpu_worker.client.dispatch import lend_back_connection

waiting, done, out = threading.Event(), threading.Event(), {}
def chat():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    lend_back_connection()  # what wait_chat does before it waits for the worker
    waiting.set()
    done.wait(30)
    with connection.cursor() as cursor:  # the request's work after the reply
        cursor.execute("SELECT 2")
        out["after"] = cursor.fetchone()[0]
    close_old_connections()
def other():
    waiting.wait(30)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 3")
            out["other"] = cursor.fetchone()[0]
    except Exception as exc:
        out["other"] = type(exc).__name__
    close_old_connections()
    done.set()
threads = [threading.Thread(target=chat), threading.Thread(target=other)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps([out.get("other"), out.get("after")]))
"""


@pytest.mark.django_db
def test_a_waiting_chat_lends_its_pooled_connection_back():
    from django.db import connection

    from tests.workers import database_url_from_settings

    url = database_url_from_settings(connection.settings_dict)
    env = {"DATABASE_URL": url, "DB_POOL_MAX_SIZE": "1", "DB_POOL_MIN_SIZE": "1",
           "DB_POOL_TIMEOUT": "1"}
    assert _run(WAITING, **env) == [3, 2]
    held = WAITING.replace("    lend_back_connection()  # what", "    # held: what")
    assert _run(held, **env) == ["OperationalError", 2]  # without it: the pool's timeout
