"""HTTP helper the chat e2e tests share: ``post`` a JSON body with a member's token to the
live server (the ``alice`` fixture is conftest's)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def post(base: str, path: str, key: str | None, body: dict | bytes) -> tuple[int, dict]:
    """``body`` (JSON, or raw bytes as sent) POSTed with ``key`` (None: no token)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Token {key}")
    try:
        with urllib.request.urlopen(req, timeout=180) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())

