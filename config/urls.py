from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from tenants import api, health

handler404 = "tenants.errors.json_404"
handler500 = "tenants.errors.json_500"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/chat", api.ChatView.as_view(), name="api-chat"),
    path("api/conversations", api.ConversationListView.as_view(), name="api-conversations"),
    path("api/conversations/<int:pk>", api.ConversationDetailView.as_view(),
         name="api-conversation"),
    path("api/preference", api.PreferenceView.as_view(), name="api-preference"),
    path("api/me", api.MeView.as_view(), name="api-me"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("gpu_worker.urls")),  # /metrics (Prometheus, token-protected)
]
