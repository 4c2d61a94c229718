"""`manage.py tenant ...` as operators and acceptance checks use it."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tenants.models import ApiToken, AuditEvent, AuditLog, Member, Tenant

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("tenant", *args, stdout=out)
    return out.getvalue()


def test_create_adduser_list():
    assert "created tenant acme" in run("create", "acme", "--name", "Acme Corp")
    out = run("adduser", "acme", "alice", "--preference", "vegetarian")
    key = out.strip().splitlines()[-1]
    token = ApiToken.objects.get(key_hash=ApiToken.hash_key(key))
    assert token.member.user.username == "alice" and token.tenant.slug == "acme"
    assert token.member.preference.text == "vegetarian"
    # the preference is the member's first memory (issue 22)
    assert list(token.member.memories.values_list("text", flat=True)) == ["vegetarian"]
    run("adduser", "acme", "boss", "--admin")
    boss = Member.objects.get(user__username="boss")
    assert boss.role == Member.Role.ADMIN and boss.user.is_staff
    rows = json.loads(run("list", "--json"))
    assert rows == [{"slug": "acme", "name": "Acme Corp", "active": True, "members": 2}]
    events = set(AuditLog.objects.values_list("event_type", flat=True))
    assert {AuditEvent.TENANT_CREATED, AuditEvent.MEMBER_CREATED,
            AuditEvent.PREFERENCE_CREATED, AuditEvent.TOKEN_CREATED} <= events


def test_token_mints_and_revokes_scoped_to_the_tenant():
    run("create", "acme")
    run("create", "globex")
    first = run("adduser", "acme", "alice").strip().splitlines()[-1]
    second = run("token", "acme", "alice").strip().splitlines()[-1]
    live = set(ApiToken.objects.filter(revoked=False).values_list("key_hash", flat=True))
    assert {ApiToken.hash_key(first), ApiToken.hash_key(second)} <= live
    third = run("token", "acme", "alice", "--revoke-all").strip()
    live = set(ApiToken.objects.filter(revoked=False).values_list("key_hash", flat=True))
    assert live == {ApiToken.hash_key(third)}
    assert AuditLog.objects.filter(event_type=AuditEvent.TOKEN_REVOKED).count() == 2
    with pytest.raises(CommandError, match="Unknown user"):
        run("token", "globex", "alice")  # alice exists, but not in globex


def test_deluser_deletes_the_member_in_its_tenant_only():
    run("create", "acme")
    run("create", "globex")
    run("adduser", "acme", "alice", "--preference", "vegetarian")
    run("adduser", "globex", "bob")
    with pytest.raises(CommandError, match="Unknown user"):
        run("deluser", "globex", "alice")  # alice exists, but not in globex
    assert Member.objects.filter(user__username="alice").exists()
    assert "deleted" in run("deluser", "acme", "alice")
    assert not Member.objects.filter(user__username="alice").exists()
    assert not ApiToken.objects.filter(member__user__username="alice").exists()
    assert Member.objects.filter(user__username="bob", tenant__slug="globex").exists()
    row = AuditLog.objects.get(event_type=AuditEvent.MEMBER_DELETED)
    assert row.tenant.slug == "acme"


@pytest.mark.parametrize("args, message", [
    (("adduser", "nope", "x"), "Unknown tenant"),
    (("create", "Bad Slug"), "slug"),
])
def test_clear_errors(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_duplicates_refused_and_nothing_half_written():
    run("create", "acme")
    with pytest.raises(CommandError, match="already exists"):
        run("create", "acme")
    run("adduser", "acme", "alice")
    run("create", "globex")
    with pytest.raises(CommandError, match="not available"):
        run("adduser", "globex", "alice")  # a user belongs to one tenant (not named)
    assert Tenant.objects.count() == 2
    assert Member.objects.filter(tenant__slug="globex").count() == 0


def test_command_exit_code_nonzero():
    """A real `manage.py` process (against the test database) exits non-zero."""
    import os
    import subprocess
    import sys

    from django.db import connection

    from tests.workers import ROOT, database_url_from_settings

    env = {**os.environ, "DATABASE_URL": database_url_from_settings(connection.settings_dict),
           "DJANGO_SETTINGS_MODULE": "config.settings_test"}
    proc = subprocess.run([sys.executable, "manage.py", "tenant", "adduser", "nope", "x"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode != 0
    assert "Unknown tenant" in proc.stderr
