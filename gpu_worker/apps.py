from django.apps import AppConfig


class GpuWorkerConfig(AppConfig):
    name = "gpu_worker"
    label = "gpu_worker"

    def ready(self) -> None:
        from gpu_worker import signals  # noqa: F401  (celery worker lifecycle hooks)
