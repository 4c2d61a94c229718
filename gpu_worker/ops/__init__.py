"""Operations: ``manage.py kvcache`` (stats, clear, warm, verify, rotate-key), Prometheus
metrics, the log policy, and the demo's supervisor and readiness wait.
"""
