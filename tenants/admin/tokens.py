"""API token admin: issue (name, optional expiry; the key is shown once, on a page of its
own with a copy button) and revoke; tokens are never edited or deleted."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import AdminSplitDateTime
from django.template.response import TemplateResponse
from django.utils import timezone

from tenants import actions
from tenants.admin.scoping import TenantScopedAdmin
from tenants.models import ApiToken


class ApiTokenForm(forms.ModelForm):
    expires_at = forms.SplitDateTimeField(
        required=False, widget=AdminSplitDateTime, label="Expires",
        help_text="Optional (site time zone). After this moment the token is refused; "
                  "empty: it never expires.")

    class Meta:
        model = ApiToken
        fields = ("member", "name", "expires_at")

    def clean_expires_at(self):
        value = self.cleaned_data.get("expires_at")
        if value is not None and value <= timezone.now():
            raise forms.ValidationError("Pick a moment in the future, or leave it empty.")
        return value


@admin.register(ApiToken)
class ApiTokenAdmin(TenantScopedAdmin):
    form = ApiTokenForm
    list_display = ("prefix", "name", "member", "created_at", "last_used_at", "expires_at",
                    "status")
    list_filter = ("revoked",)
    list_select_related = ("member__user", "member__tenant")
    search_fields = ("prefix", "name", "member__user__username")
    autocomplete_fields = ("member",)
    actions = ("revoke",)

    @admin.display(description="status")
    def status(self, obj: ApiToken) -> str:
        if obj.revoked:
            return "revoked"
        if obj.expires_at is not None and obj.expires_at <= timezone.now():
            return "expired"
        return "active"

    def get_fields(self, request, obj=None):
        return ("member", "name", "expires_at") if obj is None else (
            "prefix", "name", "member", "created_at", "last_used_at", "expires_at", "revoked")

    def has_change_permission(self, request, obj=None):
        return False  # tokens are issued and revoked, never edited

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row documents the key that existed

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        key = self.run_action(request, actions.do_create_api_token, data["member"],
                              name=data.get("name", ""), expires_at=data.get("expires_at"))
        token = ApiToken.objects.get(key_hash=ApiToken.hash_key(key))
        obj.pk, obj.prefix, obj.created_at = token.pk, token.prefix, token.created_at
        request._kvi_new_key = (token, key)

    def response_add(self, request, obj, post_url_continue=None):
        """The key, once: a page of its own (never in a session message), not cached."""
        token, key = request._kvi_new_key
        response = TemplateResponse(request, "admin/kvi_token_created.html", {
            **self.admin_site.each_context(request), "title": "API token created",
            "token": token, "key": key, "opts": self.opts})
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        count = 0
        for token in queryset.filter(revoked=False).select_related("member__user", "tenant"):
            self.run_action(request, actions.do_revoke_api_token, token)
            count += 1
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
