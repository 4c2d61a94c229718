"""The web layer's native API (``/api/*``): DRF views, serializers and strict fields, token
authentication, permissions, throttling, headers, probes and the error handler.
"""
