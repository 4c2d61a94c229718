"""API-token authentication: ``Authorization: Token <key>`` (or ``Bearer <key>``)."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication
from rest_framework import exceptions as drf_exc

from tenants.models import ApiToken

# last_used_at is kept to this resolution: one UPDATE a minute per token, not per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class MemberTokenAuthentication(authentication.BaseAuthentication):
    keywords = ("token", "bearer")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise drf_exc.AuthenticationFailed("Malformed Authorization header.")
        key = header[1].decode(errors="replace")
        now = timezone.now()
        token = (
            ApiToken.objects.select_related("member__tenant", "member__user")
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now),
                    key_hash=ApiToken.hash_key(key), revoked=False)
            .first()
        )
        if token is None or token.member.tenant_id != token.tenant_id:
            raise drf_exc.AuthenticationFailed("Invalid, expired or revoked token.")
        if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        # the caller's member, loaded with the token (one per user): request_member's, so it
        # is not looked up again
        request._kvi_member = token.member
        return token.member.user, token

    def authenticate_header(self, request) -> str:
        return "Token"


class MemberTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema (and the docs UI's "Authorize" button) describes the token."""

    target_class = MemberTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "API token of a member, sent as `Token <key>` (or `Bearer <key>`).",
        }
