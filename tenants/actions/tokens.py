"""API tokens: issued (key shown once, hash stored) and revoked, never edited."""

from __future__ import annotations

import secrets
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from tenants.actions.base import assert_actor_may_manage, audit
from tenants.errors import InvalidInput
from tenants.models import ApiToken, AuditEvent, Member

TOKEN_NAME_MAX_CHARS = 100


def _validate_token(name: str, expires_at: datetime | None) -> None:
    if len(name) > TOKEN_NAME_MAX_CHARS:
        raise InvalidInput(f"A token name is limited to {TOKEN_NAME_MAX_CHARS} characters.")
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput("The expiry must be in the future (or empty: never expires).")


@transaction.atomic
def do_create_api_token(member: Member, *, name: str = "", expires_at: datetime | None = None,
                        actor=None) -> str:
    """Create a token and return the key (shown once; only its hash is stored)."""
    _validate_token(name, expires_at)
    assert_actor_may_manage(actor, member.tenant)
    key = f"kvi_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        tenant=member.tenant, member=member, key_hash=ApiToken.hash_key(key), prefix=key[:12],
        name=name, expires_at=expires_at,
    )
    audit(member.tenant, AuditEvent.TOKEN_CREATED, actor=actor, target=str(member),
          prefix=token.prefix, name=name,
          expires_at=expires_at.isoformat() if expires_at else None)
    return key


@transaction.atomic
def do_revoke_api_token(token: ApiToken, *, actor=None) -> None:
    token.revoked = True
    token.save(update_fields=["revoked"])
    audit(token.tenant, AuditEvent.TOKEN_REVOKED, actor=actor, target=str(token.member),
          prefix=token.prefix)
