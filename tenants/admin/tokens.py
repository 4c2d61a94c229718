"""API token admin: issue (key shown once) and revoke; tokens are never edited or deleted."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from tenants import actions
from tenants.admin.scoping import TenantScopedAdmin
from tenants.models import ApiToken


class ApiTokenForm(forms.ModelForm):
    class Meta:
        model = ApiToken
        fields = ("member",)


@admin.register(ApiToken)
class ApiTokenAdmin(TenantScopedAdmin):
    form = ApiTokenForm
    list_display = ("prefix", "member", "created_at", "last_used_at", "revoked")
    list_filter = ("revoked",)
    list_select_related = ("member__user", "member__tenant")
    search_fields = ("prefix", "member__user__username")
    autocomplete_fields = ("member",)
    actions = ("revoke",)

    def get_fields(self, request, obj=None):
        return ("member",) if obj is None else (
            "prefix", "member", "created_at", "last_used_at", "revoked")

    def has_change_permission(self, request, obj=None):
        return False  # tokens are issued and revoked, never edited

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row documents the key that existed

    def save_model(self, request, obj, form, change):
        key = self.run_action(request, actions.do_create_api_token, form.cleaned_data["member"])
        token = ApiToken.objects.get(key_hash=ApiToken.hash_key(key))
        obj.pk, obj.prefix, obj.created_at = token.pk, token.prefix, token.created_at
        self.message_user(request, f"New API token for {token.member} (shown only now): {key}",
                          messages.WARNING)

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        count = 0
        for token in queryset.filter(revoked=False).select_related("member__user", "tenant"):
            self.run_action(request, actions.do_revoke_api_token, token)
            count += 1
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
