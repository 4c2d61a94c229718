"""HTTP helpers the chat e2e tests share: ``post`` a JSON body with a member's token to the
live server, and the ``alice`` fixture (tenant "acme", member "alice" with a preference,
and her API token)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tenants import actions


def post(base: str, path: str, key: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Token {key}")
    try:
        with urllib.request.urlopen(req, timeout=180) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def alice():
    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian, no spicy food.")
    return member, actions.do_create_api_token(member)
