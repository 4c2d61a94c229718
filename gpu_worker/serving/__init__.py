"""Inside a GPU worker process: the model host, the chat and playground turns, task time
limits, the per-process runtime wired to Celery signals and the control handlers.
"""
