"""API tokens: issued (key shown once, hash stored) and revoked, never edited."""

from __future__ import annotations

import secrets

from django.db import transaction

from tenants.actions.base import audit
from tenants.models import ApiToken, AuditEvent, Member


@transaction.atomic
def do_create_api_token(member: Member, *, actor=None) -> str:
    """Create a token and return the key (shown once; only its hash is stored)."""
    key = f"kvi_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        tenant=member.tenant, member=member, key_hash=ApiToken.hash_key(key), prefix=key[:12]
    )
    audit(member.tenant, AuditEvent.TOKEN_CREATED, actor=actor, target=str(member),
          prefix=token.prefix)
    return key


@transaction.atomic
def do_revoke_api_token(token: ApiToken, *, actor=None) -> None:
    token.revoked = True
    token.save(update_fields=["revoked"])
    audit(token.tenant, AuditEvent.TOKEN_REVOKED, actor=actor, target=str(token.member),
          prefix=token.prefix)
