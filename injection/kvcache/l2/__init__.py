"""The Redis tier's parts: the background writer, the tenants' link budget (``links``),
maintenance (eviction, verification, sizes) and its SCAN helpers. The tier itself is
``injection.kvcache.redis_tier``."""
