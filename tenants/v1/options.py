"""/v1 request fields beyond the conversation: tools, tool_choice, response_format, metadata.

What the served model cannot do is refused with a 400 naming the field; what changes
nothing here is accepted, as OpenAI accepts it:

* ``tools`` are validated as OpenAI does and accepted. No served chat template renders
  tools (SmolLM2's and the demo model's have no ``tools`` variable), so the model never
  sees them and never calls one: ``tool_choice`` ``"auto"``/``"none"`` (or absent) answers
  without tool calls, which is a valid ``auto`` outcome. ``"required"`` or a named
  function cannot be honoured: 400 naming ``tool_choice``.
* ``response_format`` ``{"type": "text"}`` is the default; ``json_object`` and
  ``json_schema`` are not enforced by the engine: 400 naming ``response_format``.
* ``metadata``: up to 16 string pairs (OpenAI's limits), accepted and not used.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

MAX_TOOLS = 128  # OpenAI's limit
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NO_TOOLS = ("This model cannot call tools (its chat template has no tool support): "
            "use tool_choice 'auto' or 'none', and the reply comes without tool calls.")


def _function(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise serializers.ValidationError({where: ["Must be an object."]})
    unknown = set(value) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise serializers.ValidationError(
            {f"{where}.{min(unknown)}": ["Unrecognized request argument supplied."]})
    name = value.get("name")
    if not (isinstance(name, str) and TOOL_NAME.match(name)):
        raise serializers.ValidationError(
            {f"{where}.name": ["Must be 1-64 letters, digits, '_' or '-'."]})
    if not isinstance(value.get("description", ""), str):
        raise serializers.ValidationError({f"{where}.description": ["Must be a string."]})
    if not isinstance(value.get("parameters", {}), dict):
        raise serializers.ValidationError({f"{where}.parameters": ["Must be a JSON Schema object."]})
    if value.get("strict") not in (None, True, False):
        raise serializers.ValidationError({f"{where}.strict": ["Must be a boolean."]})
    return value


def validate_tools(value: Any) -> list[dict[str, Any]]:
    """OpenAI's ``tools``: a list of ``{"type": "function", "function": {name, ...}}``."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise serializers.ValidationError(f"Must be a list of at most {MAX_TOOLS} tools.")
    names = set()
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) - {
                "type", "function"}:
            raise serializers.ValidationError(
                {str(i): ["Must be {\"type\": \"function\", \"function\": {...}}."]})
        name = _function(tool.get("function"), f"{i}.function")["name"]
        if name in names:
            raise serializers.ValidationError({f"{i}.function.name": ["Duplicate tool name."]})
        names.add(name)
    return value


def validate_tool_choice(value: Any, tools: list[dict[str, Any]]) -> str:
    """``"auto"``/``"none"`` (the reply has no tool calls); anything else cannot be honoured."""
    if value is None or value in ("auto", "none"):
        return value or "auto"
    if value == "required" or (isinstance(value, dict) and value.get("type") == "function"):
        if value != "required" and not tools:
            raise serializers.ValidationError("Only allowed when tools are specified.")
        raise serializers.ValidationError(NO_TOOLS)
    raise serializers.ValidationError(
        "Must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
        "{\"name\": ...}}.")


def validate_response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text" and set(value) == {"type"}:
        return value
    if kind in ("json_object", "json_schema"):
        raise serializers.ValidationError(
            f"'{kind}' is not supported by this server (the engine does not constrain "
            "output); use {\"type\": \"text\"}.")
    raise serializers.ValidationError("Must be {\"type\": \"text\"}.")


def validate_metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not (isinstance(value, dict) and len(value) <= 16 and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in value.items())):
        raise serializers.ValidationError(
            "Must be an object of at most 16 string pairs (keys up to 64 characters, "
            "values up to 512).")
    return value
