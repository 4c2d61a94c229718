"""What the API's fields mean, written once: the OpenAPI schema's help texts (``/api/docs``)
and docs/API.md's field tables say the same, word for word (``tests/test_reference.py``
checks each table row against this package; the docs may add links, nothing else).

One line each, at most 40 words; how a feature behaves is told below docs/API.md's tables.
"""

from __future__ import annotations

from tenants.api.fielddocs.chat import CHAT_REQUEST, CHAT_RESPONSE
from tenants.api.fielddocs.memories import MEMORY_RULES
from tenants.api.fielddocs.v1 import NEUTRAL_V1, V1_EXTENSION, V1_REQUEST

__all__ = ["CHAT_REQUEST", "CHAT_RESPONSE", "MEMORY_RULES", "NEUTRAL_V1", "V1_EXTENSION",
           "V1_REQUEST"]
