"""Token budgets in the admin: superusers set tenants' budgets (and members'), tenant
admins set their own members' budgets (never above the tenant's) and see the tenant's.
Every save and delete goes through ``tenants.actions`` (audited, same transaction)."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from tenants import actions
from tenants.admin.scoping import TenantScopedAdmin, admin_scope
from tenants.budgets import ledger
from tenants.errors import InvalidInput
from tenants.models import TokenBudget


class TokenBudgetForm(forms.ModelForm):
    class Meta:
        model = TokenBudget
        fields = ("tenant", "member", "tokens", "period")

    def clean(self):
        data = super().clean()
        tenant, member = data.get("tenant") or self.kvi_tenant, data.get("member")
        if self.instance.pk is not None:  # who holds a budget never changes
            tenant, member = self.instance.tenant, self.instance.member
        if tenant is None:
            return data
        if member is not None and member.tenant_id != tenant.pk:
            raise forms.ValidationError({"member": "This member belongs to another tenant."})
        if member is None and not self.kvi_superuser:
            raise forms.ValidationError({"member": "Pick a member: the tenant's own budget "
                                                   "is set by the platform's operators."})
        if self.instance.pk is None and TokenBudget.objects.filter(
                tenant=tenant, member=member).exists():
            raise forms.ValidationError("This budget exists already; change it instead.")
        try:
            actions.check_budget(tenant, member, data.get("tokens"), data.get("period"))
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message) from exc
        data["tenant"] = tenant
        return data


@admin.register(TokenBudget)
class TokenBudgetAdmin(TenantScopedAdmin):
    form = TokenBudgetForm
    list_display = ("holder", "tokens", "period", "spent_now", "updated_at")
    list_select_related = ("tenant", "member__user")
    autocomplete_fields = ("member",)
    superuser_list_filter = ("tenant", "period")

    @admin.display(description="budget of")
    def holder(self, obj: TokenBudget) -> str:
        return str(obj.member) if obj.member_id else f"{obj.tenant.slug} (whole tenant)"

    @admin.display(description="spent this period")
    def spent_now(self, obj: TokenBudget) -> str:
        st = ledger.standing(obj)
        return f"{st.spent} ({st.percent:.0f}%), {st.reserved} held by running chats"

    def get_fields(self, request, obj=None):
        if self.is_superuser(request):
            return ("tenant", "member", "tokens", "period")
        return ("member", "tokens", "period")

    def get_readonly_fields(self, request, obj=None):
        return ("tenant", "member") if obj is not None else ()

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        scope = admin_scope(request)
        form.kvi_superuser = bool(scope and scope.everything)
        form.kvi_tenant = obj.tenant if obj is not None else (scope.tenant if scope else None)
        return form

    def _tenants_own(self, request, obj) -> bool:
        """A tenant admin may look at the tenant's own budget, never change it."""
        return obj is not None and obj.member_id is None and not self.is_superuser(request)

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and not self._tenants_own(
            request, obj)

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and not self._tenants_own(
            request, obj)

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        tenant = obj.tenant if change else data["tenant"]
        member = obj.member if change else data.get("member")
        saved = self.run_action(request, actions.do_set_budget, tenant, member=member,
                                tokens=data["tokens"], period=data["period"])
        obj.pk, obj.tenant, obj.member = saved.pk, saved.tenant, saved.member

    def delete_model(self, request, obj):
        self.run_action(request, actions.do_clear_budget, obj.tenant, member=obj.member)

    def delete_queryset(self, request, queryset):
        for budget in queryset.select_related("tenant", "member__user"):
            if not self._tenants_own(request, budget):
                self.delete_model(request, budget)
