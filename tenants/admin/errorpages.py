"""403 and 404 pages of the admin in the admin's own look (other paths keep theirs: JSON
for the API, Django's defaults elsewhere). They name nothing about the object asked for."""

from __future__ import annotations

from django.contrib import admin
from django.template.response import TemplateResponse
from django.views import defaults

from tenants.api.exceptions import json_404

TEXT = {
    403: ("Not allowed", "Your account may not open this page. Tenant admins see their own "
                         "tenant's pages; platform pages are for superusers."),
    404: ("Not found", "There is no such page, or it belongs to something you cannot see."),
}


def _is_admin(request) -> bool:
    return request.path_info.startswith("/admin/")


def _page(request, status: int):
    title, text = TEXT[status]
    context = {**admin.site.each_context(request), "title": title, "text": text,
               "status": status}
    response = TemplateResponse(request, "admin/kvi_error.html", context, status=status)
    return response.render()


def not_found(request, exception=None):
    return _page(request, 404) if _is_admin(request) else json_404(request, exception)


def permission_denied(request, exception=None):
    if _is_admin(request):
        return _page(request, 403)
    return defaults.permission_denied(request, exception)
