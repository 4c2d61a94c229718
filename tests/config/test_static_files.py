"""With DJANGO_DEBUG=0 (production) the web serves the admin's CSS and JS from STATIC_ROOT,
filled by `collectstatic` as the image build does (platform/Dockerfile)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request

from tests.workers import ROOT, AsgiServer


def test_the_production_web_serves_collected_static_files(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DJANGO_DEBUG": "0",
           "DJANGO_SECRET_KEY": "static-test-only-" * 3, "KV_SIGNING_SECRET": "static-kv-" * 4,
           "DJANGO_STATIC_ROOT": str(tmp_path / "static")}
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput"], cwd=ROOT,
                   env=env, check=True, capture_output=True)
    assert (tmp_path / "static" / "admin" / "css" / "base.css").exists()
    web = AsgiServer(env, tmp_path)
    try:
        web.wait_ready()
        with urllib.request.urlopen(f"{web.url}/static/admin/css/base.css", timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/css")
            assert r.read() == (tmp_path / "static" / "admin" / "css" / "base.css").read_bytes()
        for outside in ("../../config/settings.py", "%2e%2e/%2e%2e/config/settings.py",
                        "admin/css/missing.css"):
            try:
                urllib.request.urlopen(f"{web.url}/static/{outside}", timeout=10)
                raise AssertionError(f"{outside} was served")
            except urllib.error.HTTPError as err:
                assert err.code in (400, 404), outside
    finally:
        web.stop()
