"""The engine's error family. Callers map these to HTTP (4xx for InvalidRequest)."""

from __future__ import annotations

__all__ = [
    "ContextLengthExceeded", "EngineUnavailable", "InjectionError", "InvalidRequest",
    "ModelOOMError", "ModelLoadError",
]


class InjectionError(Exception):
    """Base of every error the injection engine raises on purpose."""


class InvalidRequest(InjectionError, ValueError):
    """The request itself is bad (empty prompt, too long, bad alpha): a client error."""


class ContextLengthExceeded(InvalidRequest):
    """The conversation cannot fit the model's context even with no history at all."""


class ModelOOMError(InjectionError):
    """The accelerator ran out of memory even after freeing its cache and retrying once."""


class ModelLoadError(InjectionError):
    """A model directory could not be loaded (missing, unsupported architecture or cache)."""


class EngineUnavailable(InjectionError):
    """The batch engine stopped or its scheduler was found stuck or dead: the request was
    not answered and may be retried (the worker restarts). Maps to a 503 at the web."""
