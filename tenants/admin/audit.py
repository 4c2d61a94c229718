"""Audit log admin: read-only for everyone, exact times, who acted, diffs and CSV export."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.urls import path
from django.utils.html import format_html

from tenants.admin import auditview
from tenants.admin.csvexport import csv_response
from tenants.admin.scoping import TenantScopedAdmin
from tenants.models import AuditLog

User = get_user_model()
CSV_HEADER = ("time", "event", "actor kind", "actor", "tenant", "target", "data")


@admin.register(AuditLog)
class AuditLogAdmin(TenantScopedAdmin):
    list_display = ("when", "event_type", "actor_kind_label", "actor_name", "target", "tenant")
    list_filter = ("event_type", "actor_kind", ("actor", admin.RelatedOnlyFieldListFilter),
                   ("created_at", admin.DateFieldListFilter))
    list_select_related = ("tenant", "actor")
    # ``data`` is searched as its JSON text (Postgres ``data::text ILIKE``).
    search_fields = ("target", "event_type", "data")
    search_help_text = "Searches the event type, the target and the event's data."
    date_hierarchy = "created_at"
    fields = ("when", "event_type", "tenant", "actor_kind_label", "actor_name", "target",
              "changes", "data_json")
    readonly_fields = fields
    actions = None
    change_list_template = "admin/tenants/auditlog/change_list.html"

    def _actor(self, obj: AuditLog):
        if obj.actor_id is None:
            return None
        field = AuditLog._meta.get_field("actor")
        if field.is_cached(obj):
            return field.get_cached_value(obj, default=None)
        return User.objects.filter(pk=obj.actor_id).first()

    @admin.display(description="time", ordering="created_at")
    def when(self, obj: AuditLog) -> str:
        return auditview.exact_time(obj.created_at)

    @admin.display(description="actor kind", ordering="actor_kind")
    def actor_kind_label(self, obj: AuditLog) -> str:
        return auditview.actor_kind(obj, self._actor(obj))

    @admin.display(description="actor", ordering="actor__username")
    def actor_name(self, obj: AuditLog) -> str:
        actor = self._actor(obj)
        if obj.actor_id is None:
            return f"({auditview.actor_kind(obj, None)})"
        return actor.get_username() if actor else f"deleted user #{obj.actor_id}"

    @admin.display(description="before / after")
    def changes(self, obj: AuditLog):
        return auditview.before_after(obj)

    @admin.display(description="data")
    def data_json(self, obj: AuditLog):
        return format_html("<pre>{}</pre>", auditview.pretty_json(obj.data))

    def get_urls(self):
        export = self.admin_site.admin_view(self.export_csv)
        return [path("export.csv", export, name="tenants_auditlog_export"), *super().get_urls()]

    def export_csv(self, request):
        """The changelist's rows (same scope, filters and search) as CSV."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        qs = self.get_changelist_instance(request).get_queryset(request)

        def rows():
            for obj in qs.iterator(chunk_size=2000):
                yield (auditview.exact_time(obj.created_at), obj.event_type,
                       self.actor_kind_label(obj), self.actor_name(obj), obj.tenant or "",
                       obj.target, auditview.pretty_json(obj.data).replace("\n", " "))

        return csv_response("audit-log.csv", CSV_HEADER, rows())

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
