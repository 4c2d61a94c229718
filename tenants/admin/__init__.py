"""Django admin, scoped per tenant.

- Superusers see and manage everything.
- A tenant admin (staff user whose Member has role admin, both active, tenant active) sees
  only their own tenant: querysets, foreign-key pickers, autocomplete, list filters and
  search are all filtered to it, and object pages of other tenants are 404.
- Everyone else with ``is_staff`` sees nothing. Django model permissions are not used:
  access follows from the tenant role, so a stray permission grant cannot widen it.
- Every save/delete goes through ``tenants.actions`` so the audit row is written in the
  same transaction; the audit log itself is read-only for everyone.

Django's autodiscovery imports this package; importing the modules below registers every
ModelAdmin (and re-registers User/Group for superusers only).
"""

from django.contrib import admin

from tenants.admin.audit import AuditLogAdmin
from tenants.admin.budgets import TokenBudgetAdmin, TokenBudgetForm
from tenants.admin.members import (
    MemberAddForm,
    MemberAdmin,
    MemberChangeForm,
    TokensGoWithTheirMember,
)
from tenants.admin.memories import MemoryAdmin, MemoryForm
from tenants.admin.preferences import PreferenceAdmin, PreferenceForm
from tenants.admin.scoping import Scope, TenantScopedAdmin, admin_scope, in_scope, scope_queryset
from tenants.admin.tenants import TenantAdmin, TenantForm
from tenants.admin.tokens import ApiTokenAdmin, ApiTokenForm
from tenants.admin.users import PlatformGroupAdmin, PlatformUserAdmin, SuperuserOnly

admin.site.site_header = "kvinject administration"
admin.site.site_title = "kvinject admin"
admin.site.site_url = None  # no public site to "view": the link would be a 404
admin.site.index_template = "admin/kvi_index.html"  # adds Usage (and Playground) links

__all__ = [
    "ApiTokenAdmin",
    "ApiTokenForm",
    "AuditLogAdmin",
    "MemberAddForm",
    "MemberAdmin",
    "MemberChangeForm",
    "MemoryAdmin",
    "MemoryForm",
    "PlatformGroupAdmin",
    "PlatformUserAdmin",
    "PreferenceAdmin",
    "PreferenceForm",
    "Scope",
    "SuperuserOnly",
    "TenantAdmin",
    "TenantForm",
    "TenantScopedAdmin",
    "TokenBudgetAdmin",
    "TokenBudgetForm",
    "TokensGoWithTheirMember",
    "admin_scope",
    "in_scope",
    "scope_queryset",
]
