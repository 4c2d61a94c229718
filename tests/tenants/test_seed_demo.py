"""`manage.py seed_demo` (run by `make demo`): the same working tokens on every run, never
a pile of live ones; a lost or revoked key is replaced and the old ones revoked."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from tenants import actions
from tenants.models import ApiToken, AuditLog
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def own_var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path


def seed() -> dict:
    out = StringIO()
    call_command("seed_demo", json=True, stdout=out)
    return json.loads(out.getvalue())


def live_tokens(username: str) -> int:
    return ApiToken.objects.filter(member__user__username=username, revoked=False).count()


def test_tokens_are_stable_across_runs(settings):
    first = seed()
    second = seed()
    assert first == second and len(first["tokens"]) == 6
    for name, key in first["tokens"].items():
        assert token_client(key).get("/api/me").status_code == 200, name
        assert live_tokens(name) == 1
    assert (settings.VAR_DIR / "secrets" / "demo-tokens.json").stat().st_mode & 0o077 == 0
    rows = AuditLog.objects.filter(event_type="token.created")
    assert rows.count() == 6 and {r.actor_kind for r in rows} == {"cli"}


def test_a_revoked_or_lost_key_is_replaced(settings):
    first = seed()
    alice = ApiToken.objects.get(key_hash=ApiToken.hash_key(first["tokens"]["alice"]))
    actions.do_revoke_api_token(alice)
    (settings.VAR_DIR / "secrets" / "demo-tokens.json").write_text(
        json.dumps({**first["tokens"], "bob": "kvi_lost"}))
    second = seed()
    changed = {n for n in first["tokens"] if first["tokens"][n] != second["tokens"][n]}
    assert changed == {"alice", "bob"}
    assert token_client(first["tokens"]["bob"]).get("/api/me").status_code == 401  # revoked
    for name in ("alice", "bob"):
        assert token_client(second["tokens"][name]).get("/api/me").status_code == 200
        assert live_tokens(name) == 1
