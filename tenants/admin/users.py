"""Django's own user/group admin, re-registered for platform operators (superusers) only."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import BadRequest

from tenants import actions
from tenants.admin.members import TokensGoWithTheirMember
from tenants.admin.scoping import admin_scope
from tenants.errors import PlatformError
from tenants.models import Member

User = get_user_model()


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
