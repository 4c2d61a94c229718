"""Members and their user accounts: creation, role/active changes, deletion, audit of
account changes and logins."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from tenants.actions.base import assert_actor_may_manage, audit
from tenants.actions.preferences import do_set_preference
from tenants.errors import Conflict, Forbidden, InvalidInput
from tenants.models import AuditEvent, AuditLog, Member, Preference, Tenant

User = get_user_model()


UNAVAILABLE = "This username is not available; choose another."


def username_unavailable(tenant: Tenant, username: str) -> str | None:
    """Why ``username`` cannot join ``tenant`` (None: it can), worded so that it never tells
    one tenant that the name exists in another: a user of this tenant is named, anything
    else (another tenant's member, a platform account) gets the same neutral answer."""
    user = User.objects.filter(username=username).first()
    if user is None:
        return None
    if Member.objects.filter(tenant=tenant, user=user).exists():
        return f"User {username!r} already exists in this tenant."
    return UNAVAILABLE


@transaction.atomic
def do_add_member(
    tenant: Tenant,
    username: str,
    *,
    admin: bool = False,
    password: str | None = None,
    preference: str | None = None,
    actor=None,
) -> Member:
    if not username or len(username) > 150:
        raise InvalidInput("Username must be 1-150 characters.")
    taken = username_unavailable(tenant, username)
    if taken:
        raise Conflict(taken)
    try:
        with transaction.atomic():
            user = User.objects.create_user(username=username, password=password)
    except IntegrityError:  # taken concurrently: say no more than above
        raise Conflict(username_unavailable(tenant, username) or UNAVAILABLE) from None
    if admin:  # tenant admins use the scoped Django admin
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    role = Member.Role.ADMIN if admin else Member.Role.USER
    member = Member.objects.create(tenant=tenant, user=user, role=role)
    audit(tenant, AuditEvent.MEMBER_CREATED, actor=actor, target=username, role=role)
    if preference is not None:
        do_set_preference(member, text=preference, actor=actor)
    return member


def _refuse_superuser_target(member: Member, actor) -> None:
    if member.user.is_superuser and not (actor is None or actor.is_superuser):
        raise Forbidden("Only a superuser may change a superuser's account.")


@transaction.atomic
def do_change_member(
    member: Member, *, role: str | None = None, active: bool | None = None, actor=None
) -> Member:
    """Change a member's role/active flag; a tenant admin role carries Django staff status."""
    if role is not None and role not in Member.Role.values:
        raise InvalidInput(f"Unknown role {role!r}.")
    assert_actor_may_manage(actor, member.tenant)
    locked = Member.objects.select_for_update().select_related("user", "tenant").get(pk=member.pk)
    _refuse_superuser_target(locked, actor)
    old = {"role": locked.role, "active": locked.active}
    new = {"role": role or old["role"], "active": old["active"] if active is None else active}
    if new == old:
        return locked
    locked.role, locked.active = new["role"], new["active"]
    locked.save(update_fields=["role", "active"])
    staff = locked.role == Member.Role.ADMIN
    if locked.user.is_staff != staff and not locked.user.is_superuser:
        locked.user.is_staff = staff
        locked.user.save(update_fields=["is_staff"])
    audit(locked.tenant, AuditEvent.MEMBER_CHANGED, actor=actor, target=str(locked), old=old,
          new=new)
    return locked


@transaction.atomic
def do_delete_member(member: Member, *, actor=None) -> None:
    """Delete a member and its user account (preference, tokens and conversations go too)."""
    assert_actor_may_manage(actor, member.tenant)
    _refuse_superuser_target(member, actor)
    if actor is not None and member.user_id == actor.pk:
        raise InvalidInput("You cannot delete your own account.")
    tenant, target = member.tenant, str(member)
    pref = Preference.objects.filter(member=member).first()
    old_pref = None if pref is None else {"text": pref.text, "enabled": pref.enabled,
                                          "alpha": pref.alpha, "version": pref.version}
    audit(tenant, AuditEvent.MEMBER_DELETED, actor=actor, target=target, role=member.role,
          preference=old_pref)
    member.user.delete()  # cascades to the member and its rows; signals invalidate K/V


@transaction.atomic
def do_record_account_change(user, fields: Iterable[str], *, created: bool = False,
                             actor=None) -> AuditLog | None:
    """Audit a change of a Django user account made by a platform operator (field names
    only: never password material)."""
    fields = sorted(f for f in fields if "password" not in f)
    if not fields and not created:
        return None
    member = Member.objects.select_related("tenant").filter(user=user).first()
    return audit(member.tenant if member else None, AuditEvent.MEMBER_CHANGED, actor=actor,
                 target=user.get_username(), account=True, created=created, fields=fields)


def do_record_login_failure(username: str, *, ip: str = "", path: str = "") -> AuditLog:
    """Audit a failed login: under the tenant of the named member (so its admins see
    attempts on their accounts), else platform-level. The password is never recorded."""
    username = (username or "")[:150]
    member = Member.objects.select_related("tenant").filter(user__username=username).first()
    return audit(member.tenant if member else None, AuditEvent.ADMIN_LOGIN_FAILED,
                 target=username, ip=ip, path=path, known_user=member is not None)


def do_record_login(user, *, ip: str = "", path: str = "") -> AuditLog:
    """Audit a (session) login; the member's tenant, or no tenant for platform users."""
    member = Member.objects.select_related("tenant").filter(user=user).first()
    return audit(member.tenant if member else None, AuditEvent.ADMIN_LOGIN, actor=user,
                 target=user.get_username(), ip=ip, path=path, superuser=user.is_superuser)
