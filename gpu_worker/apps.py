from django.apps import AppConfig


class GpuWorkerConfig(AppConfig):
    name = "gpu_worker"
    label = "gpu_worker"

    def ready(self) -> None:
        from gpu_worker.channels import outbox
        from gpu_worker.client import dispatch as client
        from gpu_worker.client import relay
        from gpu_worker.ops import metrics
        from gpu_worker.serving import signals  # noqa: F401  (signals: hooks)
        from tenants import ports

        # tenants never imports this package: it calls these through its ports.
        ports.provide("run_chat", client.run_chat)
        ports.provide("start_stream", relay.start_chat)
        ports.provide("stream_events", relay.events)
        ports.provide("task_events", relay.task_events)
        ports.provide("deliver_invalidations", outbox.deliver_now)
        ports.provide("metrics_exposition", metrics.web_exposition)
