"""URLs of gpu_worker, included by config/urls.py: ``path("", include("gpu_worker.urls"))``."""

from django.urls import path

from gpu_worker.views import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
]
