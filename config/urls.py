from django.conf import settings
from django.contrib import admin
from django.urls import path, re_path
from django.views.static import serve
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from tenants.admin import playground as admin_playground
from tenants.admin import usage as admin_usage
from tenants.admin.views import view_on_site
from tenants.api import health, metrics
from tenants.api import views as api
from tenants.api.billing import views as api_billing
from tenants.api.memories import views as api_memories
from tenants.v1 import views as openai_api

handler404 = "tenants.admin.errorpages.not_found"  # JSON for the API, admin look for /admin/
handler403 = "tenants.admin.errorpages.permission_denied"
handler500 = "tenants.api.exceptions.json_500"

urlpatterns = [
    # before admin.site.urls: replaces the admin's unscoped "view on site" shortcut
    path("admin/r/<path:content_type_id>/<path:object_id>/",
         admin.site.admin_view(view_on_site), name="admin-view-on-site"),
    path("admin/usage/", admin.site.admin_view(admin_usage.usage_view), name="admin-usage"),
    path("admin/usage/export.csv", admin.site.admin_view(admin_usage.usage_csv),
         name="admin-usage-csv"),
    path("admin/playground/", admin.site.admin_view(admin_playground.playground_view),
         name="admin-playground"),
    path("admin/playground/start/", admin.site.admin_view(admin_playground.playground_start),
         name="admin-playground-start"),
    path("admin/playground/stream/<str:run>/<str:variant>/",
         admin.site.admin_view(admin_playground.playground_stream),
         name="admin-playground-stream"),
    path("admin/playground/record/<str:run>/",
         admin.site.admin_view(admin_playground.playground_record),
         name="admin-playground-record"),
    path("admin/", admin.site.urls),
    path("api/chat", api.ChatView.as_view(), name="api-chat"),
    path("api/conversations", api.ConversationListView.as_view(), name="api-conversations"),
    path("api/conversations/<int:pk>", api.ConversationDetailView.as_view(),
         name="api-conversation"),
    path("api/preference", api.PreferenceView.as_view(), name="api-preference"),
    path("api/me", api.MeView.as_view(), name="api-me"),
    path("api/memories", api_memories.MemoryListView.as_view(), name="api-memories"),
    path("api/memories/order", api_memories.MemoryOrderView.as_view(),
         name="api-memories-order"),
    path("api/memories/<int:pk>", api_memories.MemoryDetailView.as_view(), name="api-memory"),
    path("api/usage", api_billing.UsageView.as_view(), name="api-usage"),
    path("api/tenant/instructions", api.TenantInstructionsView.as_view(),
         name="api-tenant-instructions"),
    path("v1/chat/completions", openai_api.ChatCompletionsView.as_view(),
         name="v1-chat-completions"),
    path("v1/models", openai_api.ModelsView.as_view(), name="v1-models"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),  # Prometheus, token-protected
]

if settings.SERVE_STATIC and not settings.DEBUG:  # DEBUG: config/asgi.py serves the apps' own
    # the admin's CSS and JS, collected into the image (platform/Dockerfile)
    urlpatterns.append(re_path(r"^static/(?P<path>.*)$", serve,
                               {"document_root": settings.STATIC_ROOT}))
