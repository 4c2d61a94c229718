"""The /v1 (OpenAI-compatible) request fields, their validation, and the response shapes.

Unknown fields are refused (400, ``param`` naming the field), as OpenAI does; OpenAI
fields the platform does not implement are accepted only at their neutral value.
Platform extras travel in one extension object, ``kvinject`` (``extra_body`` in the SDK).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.conf import settings
from rest_framework import serializers

from tenants.api.fielddocs import CHAT_REQUEST, V1_EXTENSION, V1_REQUEST
from tenants.api.fields import RemovedFloatField
from tenants.api.serializers import PK_MAX
from tenants.errors import ModelNotFound
from tenants.v1 import options

EXTENSION = "kvinject"
MAX_STOP = 4
NO_LOGPROBS = "Not supported by this server: the engine does not return log probabilities."
# OpenAI fields without an implementation here: accepted only with these values (or null),
# anything else is a 400 naming the field.
NEUTRAL = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": ({},),
           "modalities": (["text"],)}
# What the SDK echoes back in an assistant message it received: only the empty values.
ECHOED = {"refusal": (), "tool_calls": ([],), "function_call": (), "annotations": ([],),
          "audio": ()}


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not declare (OpenAI: "Unrecognized request argument")."""

    neutral: dict[str, tuple] = {}

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = [k for k in data if k not in self.fields and k not in self.neutral]
            if unknown:
                raise serializers.ValidationError(
                    {unknown[0]: [f"Unrecognized request argument supplied: {unknown[0]}"]})
            for name, allowed in self.neutral.items():
                if name in data and data[name] is not None and data[name] not in allowed:
                    raise serializers.ValidationError({name: [
                        "Not supported by this server; only "
                        f"{' or '.join(map(repr, allowed))} is accepted."]})
        return super().to_internal_value(data)


class ChatMessageSerializer(StrictSerializer):
    neutral = ECHOED
    role = serializers.ChoiceField(["system", "developer", "user", "assistant"])
    content = serializers.JSONField(help_text="Text, or a list of {type: text, text} parts.")
    name = serializers.CharField(required=False, max_length=64)

    def validate_content(self, value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in value
        ):
            return "\n".join(p["text"] for p in value)
        raise serializers.ValidationError("Must be a string or a list of text parts.")


class StreamOptionsSerializer(StrictSerializer):
    include_usage = serializers.BooleanField(required=False, default=False)


class ExtensionSerializer(StrictSerializer):
    alpha = serializers.FloatField(required=False, min_value=0.0, max_value=1.0,
                                   help_text=CHAT_REQUEST["alpha"])
    emphasis = RemovedFloatField(
        "Attention emphasis", strings=True,
        help_text=CHAT_REQUEST["emphasis"])
    contrast = serializers.FloatField(
        required=False, min_value=0.0, max_value=4.0,
        help_text=CHAT_REQUEST["contrast"])
    reminder = serializers.BooleanField(
        required=False,
        help_text=CHAT_REQUEST["reminder"])
    constraints = serializers.BooleanField(
        required=False,
        help_text=CHAT_REQUEST["constraints"])
    loop_guard = serializers.BooleanField(
        required=False,
        help_text=CHAT_REQUEST["loop_guard"])
    conversation = serializers.IntegerField(
        required=False, min_value=1, max_value=PK_MAX,
        help_text=V1_EXTENSION["conversation"])


class CompletionRequestSerializer(StrictSerializer):
    neutral = NEUTRAL
    model = serializers.CharField(min_length=1, help_text=V1_REQUEST["model"])
    messages = ChatMessageSerializer(many=True, allow_empty=False, min_length=1,
                                     help_text=V1_REQUEST["messages"])
    max_tokens = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=2**31 - 1,
        help_text=V1_REQUEST["max_tokens"])
    max_completion_tokens = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=2**31 - 1,
        help_text=V1_REQUEST["max_completion_tokens"])
    temperature = serializers.FloatField(required=False, allow_null=True, min_value=0.0,
                                         max_value=2.0, help_text=V1_REQUEST["temperature"])
    top_p = serializers.FloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0,
                                   help_text=V1_REQUEST["top_p"])
    seed = serializers.IntegerField(required=False, allow_null=True, min_value=0,
                                    max_value=2**63 - 1, help_text=V1_REQUEST["seed"])
    stop = serializers.JSONField(required=False, allow_null=True, help_text=V1_REQUEST["stop"])
    stream = serializers.BooleanField(required=False, default=False, allow_null=True,
                                      help_text=V1_REQUEST["stream"])
    stream_options = StreamOptionsSerializer(required=False, allow_null=True,
                                             help_text=V1_REQUEST["stream_options"])
    n = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=1,
                                 help_text=V1_REQUEST["n"])
    user = serializers.CharField(required=False, allow_blank=True, max_length=256,
                                 help_text=V1_REQUEST["user"])
    tools = serializers.JSONField(required=False, allow_null=True, help_text=V1_REQUEST["tools"])
    tool_choice = serializers.JSONField(required=False, allow_null=True,
                                        help_text=V1_REQUEST["tool_choice"])
    parallel_tool_calls = serializers.BooleanField(required=False, allow_null=True,
                                                   help_text=V1_REQUEST["parallel_tool_calls"])
    response_format = serializers.JSONField(required=False, allow_null=True,
                                            help_text=V1_REQUEST["response_format"])
    metadata = serializers.JSONField(required=False, allow_null=True,
                                     help_text=V1_REQUEST["metadata"])
    logprobs = serializers.BooleanField(required=False, allow_null=True,
                                        help_text=V1_REQUEST["logprobs"])
    top_logprobs = serializers.IntegerField(required=False, allow_null=True, min_value=0,
                                            max_value=20, help_text=V1_REQUEST["top_logprobs"])
    kvinject = ExtensionSerializer(required=False, help_text=V1_REQUEST["kvinject"])

    def validate_n(self, value):
        if value not in (None, 1):
            raise serializers.ValidationError("Only n=1 is supported.")
        return value

    def validate_top_p(self, value):
        if value is not None and value <= 0:
            raise serializers.ValidationError("Must be greater than 0.")
        return value

    def validate_logprobs(self, value):
        if value:
            raise serializers.ValidationError(NO_LOGPROBS)
        return value

    def validate_top_logprobs(self, value):
        if value is not None:
            raise serializers.ValidationError(NO_LOGPROBS)
        return value

    def validate_stop(self, value):
        stops = [value] if isinstance(value, str) else value
        if stops is None:
            return []
        if not (isinstance(stops, list) and len(stops) <= MAX_STOP
                and all(isinstance(s, str) and s for s in stops)):
            raise serializers.ValidationError(
                f"Must be a non-empty string or a list of up to {MAX_STOP} of them.")
        return stops

    validate_tools = staticmethod(options.validate_tools)
    validate_response_format = staticmethod(options.validate_response_format)
    validate_metadata = staticmethod(options.validate_metadata)

    def validate_messages(self, value):
        for m in value:
            if m["role"] == "developer":
                m["role"] = "system"
        if value[-1]["role"] != "user" or not value[-1]["content"].strip():
            raise serializers.ValidationError("The last message must be a non-empty user message.")
        if sum(len(m["content"]) for m in value) > settings.CHAT_MAX_MESSAGE_CHARS * 4:
            raise serializers.ValidationError("The messages are too long.")
        return value

    def validate(self, attrs):
        both = attrs.get("max_tokens"), attrs.get("max_completion_tokens")
        if None not in both and both[0] != both[1]:
            raise serializers.ValidationError({"max_tokens": [
                "max_tokens and max_completion_tokens differ; send one of them."]})
        try:
            attrs["tool_choice"] = options.validate_tool_choice(attrs.get("tool_choice"),
                                                                attrs.get("tools") or [])
        except serializers.ValidationError as exc:
            raise serializers.ValidationError({"tool_choice": exc.detail}) from None
        return attrs


def requested_tokens(data: dict) -> tuple[int | None, str]:
    """The completion length the request asks for, and the field that asked for it."""
    if data.get("max_completion_tokens") is not None:
        return data["max_completion_tokens"], "max_completion_tokens"
    return data.get("max_tokens"), "max_tokens"


def served_model(model_path: str) -> str:
    """The id /v1 serves the model under (OPENAI_MODEL_ID, else the model dir's name)."""
    return settings.OPENAI_MODEL_ID or Path(model_path).name


def resolve_model(requested: str, model_path: str) -> str:
    served = served_model(model_path)
    if requested != served and requested not in settings.OPENAI_MODEL_ALIASES:
        raise ModelNotFound(f"The model '{requested}' does not exist; this server serves "
                            f"'{served}' (GET /v1/models).", param="model")
    return served


def chat_params(data: dict, max_new_tokens: int) -> dict[str, Any]:
    """What the worker's chat task is asked (also the idempotency key's request hash)."""
    ext = data.get(EXTENSION) or {}
    return {
        "max_new_tokens": max_new_tokens,
        # OpenAI's default is 1 (sampling); 0 is greedy
        "temperature": 1.0 if data.get("temperature") is None else data["temperature"],
        "top_p": data.get("top_p") or 1.0,
        "seed": data.get("seed"),
        "stop": data.get("stop") or [],
        "alpha": ext.get("alpha"),
        # only when sent: the idempotency hash of requests without it stays as it was
        **({"contrast": ext["contrast"]} if ext.get("contrast") is not None else {}),
        **{k: ext[k] for k in ("reminder", "constraints", "loop_guard") if k in ext},
        "user": data.get("user") or None,
        "history": [{"role": m["role"], "content": m["content"]} for m in data["messages"][:-1]],
    }


def completion(body: dict[str, Any], model: str) -> dict[str, Any]:
    """A chat answer (the worker's body) as an OpenAI ``chat.completion``."""
    cache = body.get("cache") or {}
    return {
        "id": f"chatcmpl-{body['request_id']}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"fp_{(cache.get('fingerprint') or '')[:12]}",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": body["reply"], "refusal": None},
            "finish_reason": finish_reason(cache),
            "logprobs": None,
        }],
        "usage": usage(body.get("usage") or {}),
        EXTENSION: {"conversation": body["conversation"], "request_id": body["request_id"],
                    "cache": cache},
    }


def finish_reason(cache: dict[str, Any]) -> str:
    return "length" if cache.get("finish_reason") == "length" else "stop"


def usage(u: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens`` counts the injected system turn too and
    ``prompt_tokens_details.cached_tokens`` the part of it served from the K/V cache. The
    contrastive guide row's tokens are a platform field beside OpenAI's (named as OpenAI
    names its own: a total and its ``_details``), in none of OpenAI's counts."""
    prompt, done = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    cached = max(0, min(int(u.get("cached_tokens") or 0), prompt))
    pre, dec = (int(u.get(f"guide_{k}_tokens") or 0) for k in ("prefill", "decode"))
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": cached},
            f"{EXTENSION}_guide_tokens": pre + dec,
            f"{EXTENSION}_guide_tokens_details": {"prefill_tokens": pre, "decode_tokens": dec}}


def model_list(model_path: str) -> dict[str, Any]:
    served = served_model(model_path)
    ids = [served, *(a for a in settings.OPENAI_MODEL_ALIASES if a != served)]
    return {"object": "list", "data": [
        {"id": i, "object": "model", "created": 0, "owned_by": "kvinject"} for i in ids]}
