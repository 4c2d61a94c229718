from django.apps import AppConfig


class GpuWorkerConfig(AppConfig):
    name = "gpu_worker"
    label = "gpu_worker"
