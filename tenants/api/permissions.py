"""Tenant resolution for API requests. Fails closed: no member, no tenant, no access."""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from tenants.errors import InactiveAccount, NotAuthenticated
from tenants.models import Member


def request_member(request) -> Member:
    """The caller's Member (with tenant); raises unless both are active."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        raise NotAuthenticated()
    member = getattr(request, "_kvi_member", None)
    if member is None:
        member = Member.objects.select_related("tenant", "user").filter(user=user).first()
        if member is None:
            raise NotAuthenticated("This account is not a member of any tenant.")
        request._kvi_member = member
    if not (member.active and member.tenant.active and user.is_active):
        raise InactiveAccount()
    return member


class IsActiveMember(BasePermission):
    def has_permission(self, request, view) -> bool:
        request_member(request)
        return True
