"""Member admin: add/change/delete through the member actions, K/V cache clear and warm."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils.html import format_html

from tenants import actions
from tenants.admin.scoping import TenantScopedAdmin, admin_scope
from tenants.errors import PlatformError
from tenants.models import ApiToken, Member

User = get_user_model()


class TokensGoWithTheirMember:
    """A member's API tokens are deleted with it (audited as part of member.deleted), although
    tokens are otherwise revoked, never deleted: their delete permission must not block."""

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(ApiToken._meta.verbose_name)
        return deleted, counts, perms_needed, protected


class MemberAddForm(forms.ModelForm):
    username = forms.CharField(max_length=150)
    password = forms.CharField(
        widget=forms.PasswordInput, required=False,
        help_text="Needed only for tenant admins (admin site login); API users use tokens.",
    )

    class Meta:
        model = Member
        fields = ("tenant", "role", "active")

    def clean(self):
        data = super().clean()
        username, tenant = data.get("username"), getattr(self, "scoped_tenant", None)
        tenant = tenant or data.get("tenant")
        if username and tenant is not None:
            taken = actions.username_unavailable(tenant, username)
            if taken:  # never says that another tenant has the name
                self.add_error("username", taken)
        elif username and User.objects.filter(username=username).exists():
            self.add_error("username", actions.UNAVAILABLE)
        return data


class MemberChangeForm(forms.ModelForm):
    class Meta:
        model = Member
        fields = ("role", "active")


@admin.register(Member)
class MemberAdmin(TokensGoWithTheirMember, TenantScopedAdmin):
    list_display = ("username", "tenant", "role", "active", "preference_version", "created_at")
    list_filter = ("role", "active")
    list_select_related = ("user", "tenant", "preference")
    search_fields = ("user__username",)
    readonly_fields = ("username", "tenant", "created_at", "preference_link")
    actions = ("clear_kv_cache", "warm_kv_cache", "delete_selected")

    @admin.display(ordering="user__username")
    def username(self, obj: Member) -> str:
        return obj.user.get_username()

    @admin.display(description="preference version")
    def preference_version(self, obj: Member):
        pref = obj.own_preference()  # list_select_related: no query
        return pref.version if pref else None

    @admin.display(description="preference")
    def preference_link(self, obj: Member):
        pref = obj.own_preference()
        if pref is None:
            return "-"
        url = reverse("admin:tenants_preference_change", args=[pref.pk])
        return format_html('<a href="{}">v{}: {}</a>', url, pref.version, pref.text[:80])

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is not None:
            kwargs["form"] = MemberChangeForm
            return super().get_form(request, obj, change=change, **kwargs)
        kwargs["form"] = MemberAddForm
        form = super().get_form(request, obj, change=change, **kwargs)
        scope = admin_scope(request)
        form.scoped_tenant = None if scope.everything else scope.tenant  # whose names to name
        return form

    def get_fields(self, request, obj=None):
        if obj is not None:
            return ("username", "tenant", "role", "active", "preference_link", "created_at")
        fields = ("username", "password", "role", "active")
        return ("tenant", *fields) if self.is_superuser(request) else fields

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is not None else ()

    def has_change_permission(self, request, obj=None):
        if obj is not None and obj.user.is_superuser and not self.is_superuser(request):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.user_id == request.user.pk:
            return False
        return self.has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            self.run_action(request, actions.do_change_member, obj, role=data["role"],
                            active=data["active"])
            return
        scope = admin_scope(request)
        tenant = data["tenant"] if scope.everything else scope.tenant
        member = self.run_action(
            request, actions.do_add_member, tenant, data["username"],
            admin=data["role"] == Member.Role.ADMIN, password=data["password"] or None,
        )
        if not data["active"]:
            member = self.run_action(request, actions.do_change_member, member, active=False)
        obj.pk, obj.user, obj.tenant = member.pk, member.user, member.tenant

    def delete_model(self, request, obj):
        self.run_action(request, actions.do_delete_member, obj)

    def delete_queryset(self, request, queryset):
        for member in queryset.select_related("user", "tenant"):
            if not self.has_delete_permission(request, member):
                messages.warning(request, f"{member} was not deleted (not allowed).")
                continue
            self.run_action(request, actions.do_delete_member, member)

    @admin.action(description="Clear K/V cache of selected members")
    def clear_kv_cache(self, request, queryset):
        count = self.run_action(request, actions.do_clear_kv_cache,
                                queryset.select_related("user", "tenant"))
        self.message_user(request, f"Cleared the K/V cache of {count} member(s) "
                                   "(L2 and every worker's L1).", messages.SUCCESS)

    @admin.action(description="Warm K/V cache of selected members")
    def warm_kv_cache(self, request, queryset):
        try:
            count = self.run_action(request, actions.do_warm_kv_cache,
                                    queryset.select_related("user", "tenant"))
        except PlatformError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return
        self.message_user(request, f"Queued K/V warming for {count} member(s) with an enabled "
                                   "preference.", messages.SUCCESS)
