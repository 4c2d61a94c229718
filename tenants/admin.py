"""Django admin, scoped per tenant.

- Superusers see and manage everything.
- A tenant admin (staff user whose Member has role admin, both active, tenant active) sees
  only their own tenant: querysets, foreign-key pickers, autocomplete, list filters and
  search are all filtered to it, and object pages of other tenants are 404.
- Everyone else with ``is_staff`` sees nothing. Django model permissions are not used:
  access follows from the tenant role, so a stray permission grant cannot widen it.
- Every save/delete goes through ``tenants.actions`` so the audit row is written in the
  same transaction; the audit log itself is read-only for everyone.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import slugify

from tenants import actions
from tenants.errors import Forbidden, PlatformError
from tenants.models import ApiToken, AuditLog, Member, Preference, Tenant

User = get_user_model()
admin.site.site_header = "kvinject administration"
admin.site.site_title = "kvinject admin"


# --- scope -----------------------------------------------------------------------------


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


# --- tenants ---------------------------------------------------------------------------


class TenantForm(forms.ModelForm):
    class Meta:
        model = Tenant
        fields = ("slug", "name", "active", "audit_message_text")

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
    readonly_fields = ("created_at",)

    def member_count(self, obj: Tenant) -> int:
        return obj.members.count()

    def get_fields(self, request, obj=None):
        return ("slug", "name", "active", "audit_message_text", "created_at")

    def get_readonly_fields(self, request, obj=None):
        ro = ["created_at"]
        if obj is not None:
            ro.append("slug")
        if not self.is_superuser(request):
            ro.append("active")  # a tenant admin cannot switch their own tenant off (or on)
        return ro

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


# --- members ---------------------------------------------------------------------------


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

    def clean_username(self):
        username = self.cleaned_data["username"]
        if User.objects.filter(username=username).exists():
            raise forms.ValidationError("This username is taken.")
        return username


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
        pref = getattr(obj, "preference", None)
        return pref.version if pref else None

    @admin.display(description="preference")
    def preference_link(self, obj: Member):
        pref = Preference.objects.filter(tenant=obj.tenant_id, member=obj).first()
        if pref is None:
            return "-"
        url = reverse("admin:tenants_preference_change", args=[pref.pk])
        return format_html('<a href="{}">v{}: {}</a>', url, pref.version, pref.text[:80])

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is not None:
            kwargs["form"] = MemberChangeForm
            return super().get_form(request, obj, change=change, **kwargs)
        kwargs["form"] = MemberAddForm
        return super().get_form(request, obj, change=change, **kwargs)

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


# --- preferences -----------------------------------------------------------------------


class PreferenceForm(forms.ModelForm):
    # The version the editor saw; a concurrent change (API, another admin) is not overwritten.
    seen_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Preference
        fields = ("member", "text", "enabled", "alpha")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["seen_version"].initial = self.instance.version

    def clean_member(self):
        member = self.cleaned_data["member"]
        if not self.instance.pk and Preference.objects.filter(member=member).exists():
            raise forms.ValidationError("This member already has a preference; edit it.")
        return member

    def clean(self):
        data = super().clean()
        seen = data.get("seen_version")
        if self.instance.pk and seen is not None:
            current = Preference.objects.filter(pk=self.instance.pk).values_list(
                "version", flat=True).first()
            if current is not None and current != seen:
                raise forms.ValidationError(
                    f"This preference was changed elsewhere (now version {current}) after "
                    "you opened it. Reload the page to see the current text.")
        if "text" in data and len(data["text"]) > actions.PREFERENCE_MAX_CHARS:
            self.add_error("text", f"At most {actions.PREFERENCE_MAX_CHARS} characters.")
        return data


@admin.register(Preference)
class PreferenceAdmin(TenantScopedAdmin):
    form = PreferenceForm
    list_display = ("member", "enabled", "alpha", "version", "updated_at", "text_preview")
    list_filter = ("enabled",)
    list_select_related = ("member__user", "member__tenant")
    search_fields = ("member__user__username", "text")
    autocomplete_fields = ("member",)
    readonly_fields = ("version", "updated_at", "content_hash")
    actions = ("disable_injection", "enable_injection", "delete_selected")

    @admin.display(description="text")
    def text_preview(self, obj: Preference) -> str:
        return obj.text if len(obj.text) <= 60 else obj.text[:59] + "…"

    def get_fields(self, request, obj=None):
        fields = ("member", "text", "enabled", "alpha", "seen_version")
        return fields + self.readonly_fields if obj is not None else fields

    def get_readonly_fields(self, request, obj=None):
        return ("member", *self.readonly_fields) if obj is not None else ()

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        member = obj.member
        pref = self.run_action(request, actions.do_set_preference, member, text=data["text"],
                               enabled=data["enabled"], alpha=data["alpha"],
                               expected_version=data.get("seen_version") if change else None)
        pref.refresh_from_db()
        obj.pk, obj.version, obj.updated_at = pref.pk, pref.version, pref.updated_at

    def delete_model(self, request, obj):
        self.run_action(request, actions.do_delete_preference, obj.member)

    def delete_queryset(self, request, queryset):
        for pref in queryset.select_related("member__user", "member__tenant"):
            self.run_action(request, actions.do_delete_preference, pref.member)

    def _set_enabled(self, request, queryset, enabled: bool) -> None:
        count = 0
        for pref in queryset.select_related("member__user", "member__tenant"):
            self.run_action(request, actions.do_set_preference, pref.member, enabled=enabled)
            count += 1
        state = "enabled" if enabled else "disabled"
        self.message_user(request, f"Injection {state} for {count} preference(s).",
                          messages.SUCCESS)

    @admin.action(description="Disable injection for selected preferences")
    def disable_injection(self, request, queryset):
        self._set_enabled(request, queryset, False)

    @admin.action(description="Enable injection for selected preferences")
    def enable_injection(self, request, queryset):
        self._set_enabled(request, queryset, True)


# --- API tokens ------------------------------------------------------------------------


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


# --- audit log (read-only for everyone) -------------------------------------------------


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


# --- Django's own user/group admin: platform operators only ------------------------------


class SuperuserOnly:
    def has_module_permission(self, request):
        return bool(admin_scope(request) and admin_scope(request).everything)

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    has_add_permission = has_module_permission

    def has_change_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_delete_permission(self, request, obj=None):
        return self.has_module_permission(request)


class PlatformUserAdmin(SuperuserOnly, TokensGoWithTheirMember, UserAdmin):
    """Django's user admin; deleting a member's user goes through the member action and
    every account change is audited."""

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        actions.do_record_account_change(obj, form.changed_data, created=not change,
                                         actor=request.user)

    def delete_model(self, request, obj):
        member = Member.objects.select_related("tenant", "user").filter(user=obj).first()
        if member is None:
            super().delete_model(request, obj)
            return
        try:
            actions.do_delete_member(member, actor=request.user)
        except PlatformError as exc:
            raise BadRequest(exc.message) from exc

    def delete_queryset(self, request, queryset):
        for user in queryset:
            self.delete_model(request, user)


class PlatformGroupAdmin(SuperuserOnly, GroupAdmin):
    pass


for _model, _admin in ((User, PlatformUserAdmin), (Group, PlatformGroupAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin)
