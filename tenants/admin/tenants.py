"""Tenant admin: superusers create tenants; tenant admins edit their own (not ``active``)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils.text import slugify

from tenants import actions
from tenants.admin.memories import rules_text
from tenants.admin.scoping import TenantScopedAdmin
from tenants.models import Tenant
from tenants.rules import shown


class TenantForm(forms.ModelForm):
    class Meta:
        model = Tenant
        fields = ("slug", "name", "active", "audit_message_text", "max_completion_tokens",
                  "memory_contrast", "memory_reminder", "decoding_constraints",
                  "loop_guard", "memory_writes_enabled",
                  "instructions")
        widgets = {"instructions": forms.Textarea(attrs={"rows": 4, "cols": 80})}

    def clean_slug(self):
        slug = self.cleaned_data["slug"]
        if slugify(slug) != slug:
            raise forms.ValidationError("Use lowercase letters, digits and dashes.")
        return slug


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    form = TenantForm
    list_display = ("slug", "name", "active", "audit_message_text", "member_count",
                    "created_at")
    list_filter = ("active",)
    superuser_list_filter = ()
    search_fields = ("slug", "name")
    readonly_fields = ("created_at", "instructions_version", "instruction_rules_read")
    actions = ("instruction_rules_off", "instruction_rules_on")

    def member_count(self, obj: Tenant) -> int:
        return obj.members.count()

    @admin.display(description="instruction rules read")
    def instruction_rules_read(self, obj: Tenant) -> str:
        """What the saved instructions ask of every member's reply (admins only: members
        never see the tenant's instructions or their rules)."""
        return rules_text(shown(obj.instruction_rules, obj.instruction_rules_version,
                                obj.instructions, obj.instruction_rules_enabled,
                                instructions=True), switch=False) + (
            "" if obj.instruction_rules_enabled else " — switched off (list page actions)")

    def get_fields(self, request, obj=None):
        return ("slug", "name", "active", "audit_message_text", "max_completion_tokens",
                "memory_contrast", "memory_reminder", "decoding_constraints",
                "loop_guard", "memory_writes_enabled",
                "instructions", "instruction_rules_read", "instructions_version",
                "created_at")

    def get_readonly_fields(self, request, obj=None):
        ro = ["created_at", "instructions_version", "instruction_rules_read"]
        if obj is not None:
            ro.append("slug")
        if not self.is_superuser(request):
            ro.append("active")  # a tenant admin cannot switch their own tenant off (or on)
        return ro

    def _switch_rules(self, request, queryset, enabled: bool) -> None:
        for tenant in queryset:
            self.run_action(request, actions.do_update_tenant, tenant,
                            instruction_rules_enabled=enabled)
        state = "on" if enabled else "off"
        self.message_user(request, f"Instruction rules switched {state}.", messages.SUCCESS)

    @admin.action(description="Switch off the rules of the instructions (they stay)")
    def instruction_rules_off(self, request, queryset):
        self._switch_rules(request, queryset, False)

    @admin.action(description="Switch on the rules of the instructions")
    def instruction_rules_on(self, request, queryset):
        self._switch_rules(request, queryset, True)

    def has_add_permission(self, request):
        return self.is_superuser(request)

    def has_delete_permission(self, request, obj=None):
        return False  # tenants are deactivated, never deleted: their audit log stays

    def save_model(self, request, obj, form, change):
        changes = {f: form.cleaned_data[f] for f in form.changed_data
                   if f in actions.TENANT_FIELDS}
        if not change:
            created = self.run_action(request, actions.do_create_tenant, obj.slug, obj.name)
            obj.pk, obj.created_at = created.pk, created.created_at
            changes.pop("name", None)
        if changes:
            self.run_action(request, actions.do_update_tenant, obj, **changes)
        if "instructions" in form.changed_data:
            self.run_action(request, actions.do_set_tenant_instructions, obj,
                            form.cleaned_data["instructions"])
