"""Audit log admin: read-only for everyone."""

from __future__ import annotations

import json

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.utils.html import format_html

from tenants.admin.scoping import TenantScopedAdmin
from tenants.models import AuditLog

User = get_user_model()


@admin.register(AuditLog)
class AuditLogAdmin(TenantScopedAdmin):
    list_display = ("created_at", "event_type", "actor_name", "target", "tenant")
    list_filter = ("event_type", ("actor", admin.RelatedOnlyFieldListFilter),
                   ("created_at", admin.DateFieldListFilter))
    list_select_related = ("tenant", "actor")
    search_fields = ("target",)
    date_hierarchy = "created_at"
    fields = ("created_at", "event_type", "tenant", "actor_name", "target", "data_json")
    readonly_fields = fields
    actions = None

    @admin.display(description="actor", ordering="actor__username")
    def actor_name(self, obj: AuditLog) -> str:
        if obj.actor_id is None:
            return "-"
        field = AuditLog._meta.get_field("actor")
        actor = (field.get_cached_value(obj, default=None) if field.is_cached(obj)
                 else User.objects.filter(pk=obj.actor_id).first())
        return actor.get_username() if actor else f"deleted user #{obj.actor_id}"

    @admin.display(description="data")
    def data_json(self, obj: AuditLog):
        return format_html("<pre>{}</pre>", json.dumps(obj.data, indent=2, sort_keys=True))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
