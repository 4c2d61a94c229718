"""The web process (config/asgi.py) keeps no persistent database connections, whatever
DB_CONN_MAX_AGE says: under ASGI a request's sync code runs in threads that come and go,
each of which left its connection open (16 streaming clients held up to 82 of Postgres's
100 connections and a burst beside them was refused); a worker keeps DB_CONN_MAX_AGE."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.workers import ROOT

PROBE = ("import os, sys; sys.argv = ['probe']; import {module}; "
         "from django.conf import settings; "
         "print(settings.DATABASES['default']['CONN_MAX_AGE'])")


def conn_max_age(module: str) -> int:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DB_CONN_MAX_AGE": "60"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


def test_the_web_process_closes_its_connections_and_the_worker_keeps_its_setting():
    assert conn_max_age("config.asgi") == 0
    assert conn_max_age("config.settings") == 60
