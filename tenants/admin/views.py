"""Admin views outside ModelAdmins."""

from __future__ import annotations

from django.contrib.contenttypes.views import shortcut
from django.http import Http404

from tenants.admin.scoping import admin_scope


def view_on_site(request, content_type_id: str, object_id: str):
    """``/admin/r/<ct>/<id>/``. Django's shortcut looks the object up unscoped, and its
    answers (redirect, "doesn't exist", "no get_absolute_url") would confirm other
    tenants' ids. Superusers only; anyone else gets the same 404 whatever the id."""
    scope = admin_scope(request)
    if scope is None or not scope.everything:
        raise Http404("No such object.")
    return shortcut(request, content_type_id, object_id)
