"""Tenant scoping for the admin: who sees what (``admin_scope``), querysets and objects
limited to it, and ``TenantScopedAdmin``, the base of every tenant-owned model's admin."""

from __future__ import annotations

from typing import Any, NamedTuple

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404

from tenants.errors import Forbidden, PlatformError
from tenants.models import Member, Tenant

User = get_user_model()


class Scope(NamedTuple):
    everything: bool  # superuser
    tenant: Tenant | None  # the tenant admin's tenant


def admin_scope(request) -> Scope | None:
    """What the requesting user may see in the admin; None = nothing (fail closed)."""
    if hasattr(request, "_kvi_admin_scope"):
        return request._kvi_admin_scope
    user = getattr(request, "user", None)
    scope = None
    if user is not None and user.is_authenticated and user.is_active and user.is_staff:
        if user.is_superuser:
            scope = Scope(True, None)
        else:
            member = Member.objects.select_related("tenant").filter(user=user).first()
            if (member is not None and member.role == Member.Role.ADMIN and member.active
                    and member.tenant.active):
                scope = Scope(False, member.tenant)
    request._kvi_admin_scope = scope
    return scope


def scope_queryset(qs: QuerySet, scope: Scope | None) -> QuerySet:
    """``qs`` limited to what ``scope`` may see (any model of this project, or users)."""
    if scope is None:
        return qs.none()
    if scope.everything:
        return qs
    model = qs.model
    if model is Tenant:
        return qs.filter(pk=scope.tenant.pk)
    if model is User:
        return qs.filter(member__tenant=scope.tenant)
    if any(f.name == "tenant" for f in model._meta.get_fields()):
        return qs.filter(tenant=scope.tenant)
    return qs.none()


def in_scope(obj: Model, scope: Scope | None) -> bool:
    if scope is None:
        return False
    if scope.everything:
        return True
    tenant_id = obj.pk if isinstance(obj, Tenant) else getattr(obj, "tenant_id", None)
    return tenant_id is not None and tenant_id == scope.tenant.pk


class TenantScopedAdmin(admin.ModelAdmin):
    """Scoping for every tenant-owned model; subclasses route writes through actions."""

    superuser_list_filter: tuple = ("tenant",)
    view_on_site = False  # no public pages; /admin/r/ is superuser-only (admin/views.py)

    def get_queryset(self, request):
        return scope_queryset(super().get_queryset(request), admin_scope(request))

    def get_object(self, request, object_id, from_field=None):
        # Foreign and unknown ids alike: 404 (Django would redirect, naming the id).
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            raise Http404("No such object.")
        return obj

    def get_search_results(self, request, queryset, search_term):
        qs, distinct = super().get_search_results(request, queryset, search_term)
        return scope_queryset(qs, admin_scope(request)), distinct

    def get_list_filter(self, request):
        scope = admin_scope(request)
        extra = self.superuser_list_filter if scope and scope.everything else ()
        return (*super().get_list_filter(request), *extra)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        model = db_field.remote_field.model
        ordering = model._meta.ordering or ["pk"]
        kwargs.setdefault(
            "queryset", scope_queryset(model._default_manager.order_by(*ordering),
                                       admin_scope(request))
        )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        kwargs.setdefault("queryset", scope_queryset(
            db_field.remote_field.model._default_manager.all(), admin_scope(request)))
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    # Permissions follow the tenant role (not Django model permissions).
    def has_module_permission(self, request):
        return admin_scope(request) is not None

    def has_view_permission(self, request, obj=None):
        scope = admin_scope(request)
        return scope is not None and (obj is None or in_scope(obj, scope))

    def has_add_permission(self, request):
        return admin_scope(request) is not None

    def has_change_permission(self, request, obj=None):
        return self.has_view_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self.has_view_permission(request, obj)

    def is_superuser(self, request) -> bool:
        scope = admin_scope(request)
        return bool(scope and scope.everything)

    def run_action(self, request, fn, *args, **kwargs) -> Any:
        """Call an action as the admin user. Forms validate first; what an action still
        refuses becomes a 403/400 page and the admin view's transaction rolls back."""
        try:
            return fn(*args, actor=request.user, **kwargs)
        except Forbidden as exc:
            raise PermissionDenied(exc.message) from exc
        except PlatformError as exc:
            raise BadRequest(exc.message) from exc
