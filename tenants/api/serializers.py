"""Request validation and response shapes of the API (also what the OpenAPI schema shows)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.actions import INSTRUCTIONS_MAX_CHARS, PREFERENCE_MAX_CHARS, preference_rules
from tenants.api.fielddocs import CHAT_REQUEST, CHAT_RESPONSE, MEMORY_RULES
from tenants.api.fields import (
    NO_NUL,
    NOT_BLANK_NO_NUL,
    RemovedFloatField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)
from tenants.api.memories.serializers import RulesSerializer, StrictSerializer, rules_field
from tenants.models import Conversation, Member, Message, Preference

PK_MAX = 2**63 - 1  # Postgres bigint: larger ids are refused as input, never sent to the DB


class ChatRequestSerializer(StrictSerializer):
    """Bounds come from settings when the serializer is built (schema and validation);
    unknown fields are refused (a 400 naming them), as ``/v1`` and ``/api/memories`` do."""

    conversation = StrictIntegerField(
        required=False, min_value=1, max_value=PK_MAX,
        help_text=CHAT_REQUEST["conversation"],
    )
    temperature = StrictFloatField(
        required=False, min_value=0.0, max_value=2.0, help_text=CHAT_REQUEST["temperature"]
    )
    top_p = StrictFloatField(required=False, min_value=0.01, max_value=1.0,
                             help_text=CHAT_REQUEST["top_p"])
    alpha = StrictFloatField(
        required=False, min_value=0.0, max_value=1.0,
        help_text=CHAT_REQUEST["alpha"],
    )
    emphasis = RemovedFloatField(
        "Attention emphasis",
        help_text=CHAT_REQUEST["emphasis"],
    )
    contrast = StrictFloatField(
        required=False, min_value=0.0, max_value=4.0,
        help_text=CHAT_REQUEST["contrast"],
    )
    reminder = StrictBooleanField(
        required=False,
        help_text=CHAT_REQUEST["reminder"],
    )
    constraints = StrictBooleanField(
        required=False,
        help_text=CHAT_REQUEST["constraints"],
    )
    loop_guard = StrictBooleanField(
        required=False,
        help_text=CHAT_REQUEST["loop_guard"],
    )

    def get_fields(self):
        fields = super().get_fields()
        limit, max_tokens = settings.CHAT_MAX_MESSAGE_CHARS, settings.CHAT_MAX_NEW_TOKENS
        fields["message"] = StrictCharField(
            max_length=limit, pattern=NOT_BLANK_NO_NUL, pattern_message="Message is blank.",
            error_messages={"max_length": f"Message is limited to {limit} characters."},
            help_text=f"The user's message: not blank, at most {limit} characters "
                      "(CHAT_MAX_MESSAGE_CHARS).",
        )
        fields["max_new_tokens"] = StrictIntegerField(
            required=False, min_value=1, max_value=max_tokens,
            error_messages={"max_value": f"max_new_tokens is limited to {max_tokens}."},
            help_text=f"1..{max_tokens} (CHAT_MAX_NEW_TOKENS); default "
                      f"{settings.CHAT_DEFAULT_MAX_NEW_TOKENS}.",
        )
        return fields


class UsageSerializer(serializers.Serializer):
    prompt_tokens = serializers.IntegerField(
        help_text="Every token the model read before the reply, the injected system turn "
                  "(instructions + preference) included.")
    completion_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField(
        required=False, help_text=CHAT_RESPONSE["usage.cached_tokens"])
    guide_prefill_tokens = serializers.IntegerField(
        required=False, help_text=CHAT_RESPONSE["usage.guide_prefill_tokens"])
    guide_decode_tokens = serializers.IntegerField(
        required=False, help_text=CHAT_RESPONSE["usage.guide_decode_tokens"])


class CacheInfoSerializer(serializers.Serializer):
    """K/V figures the worker reports; more engine figures may be present."""

    tier = serializers.ChoiceField(choices=["l1", "l2", "compute", "none"],
                                   help_text="Where the preference K/V came from.")
    content_hash = serializers.CharField(
        help_text="SHA-256 of the preference text applied (as GET /api/preference reports "
                  "it); empty when no preference was applied.")
    segment_hash = serializers.CharField(
        help_text="SHA-256 of the injected system turn as rendered (tenant instructions, then "
                  "the preference): the cached K/V's identity; empty when nothing was injected.")
    preference_version = serializers.IntegerField(allow_null=True)
    instructions_version = serializers.IntegerField(
        help_text="Version of the tenant instructions the reply was generated with.")
    injection_mode = serializers.ChoiceField(
        choices=["system", "user_prefix", "inline", "none"],
        help_text="system: the context was injected as the template's system turn; "
                  "user_prefix: as the opening of the first user message (templates without "
                  "a system role); inline: kept in the prompt as text (no verified split); "
                  "none: no preference applied.")
    history_messages = serializers.IntegerField(
        help_text="Earlier messages of the conversation that fitted the model's context.")
    fingerprint = serializers.CharField(help_text="Model identity the K/V belongs to.")
    alpha_effective = serializers.FloatField()
    contrast_effective = serializers.FloatField(
        required=False, help_text=CHAT_RESPONSE["cache.contrast_effective"])
    constraints = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text=CHAT_RESPONSE["cache.constraints"])
    kv_tokens = serializers.IntegerField()
    kv_layers_count = serializers.IntegerField()
    kv_bytes_cpu = serializers.IntegerField()
    kv_fetch_latency_ms = serializers.FloatField()
    inference_latency_ms = serializers.FloatField()
    ttft_ms = serializers.FloatField(
        help_text="Time to first token on the worker: from the start of the request's "
                  "execution (K/V lookup included) to the first generated token.")
    reused_tokens = serializers.IntegerField(
        required=False,
        help_text=CHAT_RESPONSE["cache.reused_tokens"])


class MemoryUsedSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The memory's id in /api/memories.")
    text = serializers.CharField()
    how = serializers.ChoiceField(
        choices=["segment", "recalled"],
        help_text="segment: in your cached member segment; recalled: picked for this message.")


class ChatResponseSerializer(serializers.Serializer):
    reply = serializers.CharField()
    conversation = serializers.IntegerField()
    usage = UsageSerializer()
    memories_used = MemoryUsedSerializer(
        many=True, required=False,
        help_text="Your memories the reply was generated with (yours only).")
    memory_write = serializers.DictField(
        required=False,
        help_text="Only when your tenant enables memory writes and the message opened with "
                  "\"remember that ...\" or \"forget ...\": op (remembered, forgotten, "
                  "not_found, refused), id and text of the memory.")
    cache = CacheInfoSerializer()
    request_id = serializers.CharField()


class MessageSerializer(serializers.ModelSerializer):
    class Meta:
        model = Message
        fields = ["id", "role", "content", "token_count", "created_at"]


class ConversationSerializer(serializers.ModelSerializer):
    message_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Conversation
        fields = ["id", "title", "created_at", "updated_at", "message_count"]


class ConversationPageSerializer(serializers.Serializer):
    """What GET /api/conversations returns: one page of your conversations."""

    count = serializers.IntegerField(help_text="All your conversations.")
    next = serializers.URLField(allow_null=True, help_text="The next page, if any.")
    previous = serializers.URLField(allow_null=True, help_text="The previous page, if any.")
    results = ConversationSerializer(many=True)


class ConversationDetailSerializer(ConversationSerializer):
    messages = MessageSerializer(many=True, read_only=True)

    class Meta(ConversationSerializer.Meta):
        fields = [*ConversationSerializer.Meta.fields, "messages"]


class PreferenceSerializer(serializers.ModelSerializer):
    """Read shape; writes go through ``actions.do_set_preference``."""

    content_hash = serializers.CharField(read_only=True)
    rules = rules_field()

    class Meta:
        model = Preference
        fields = ["text", "enabled", "alpha", "version", "updated_at", "content_hash", "rules"]
        read_only_fields = fields

    @extend_schema_field(RulesSerializer)
    def get_rules(self, obj: Preference) -> dict:
        return preference_rules(obj.member)  # the first memory's


@extend_schema_field({"type": "string", "maxLength": PREFERENCE_MAX_CHARS, "pattern": NO_NUL})
class PreferenceTextField(StrictCharField):
    """May be blank. Not via ``allow_blank``, for which drf-spectacular would publish an
    overlapping ``oneOf`` that makes ``""`` invalid in the schema."""

    def run_validation(self, data=serializers.empty):
        return "" if data == "" else super().run_validation(data)


class PreferenceWriteSerializer(StrictSerializer):
    """PUT/PATCH /api/preference: unknown fields are refused (a 400 naming them)."""

    text = PreferenceTextField( trim_whitespace=False,
                           max_length=PREFERENCE_MAX_CHARS, pattern=NO_NUL,
                           pattern_message="Text cannot contain NUL characters.")
    enabled = StrictBooleanField(required=False)
    alpha = StrictFloatField(required=False, min_value=0.0, max_value=1.0)
    rules_enabled = StrictBooleanField(required=False, help_text=MEMORY_RULES["rules_enabled"])


class MeSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")
    tenant = serializers.CharField(source="tenant.slug")
    tenant_name = serializers.CharField(source="tenant.name")

    class Meta:
        model = Member
        fields = ["username", "tenant", "tenant_name", "role"]


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Stable machine-readable code (see docs/API.md).")
    message = serializers.CharField()
    fields = serializers.DictField(required=False, help_text="Per-field problems (invalid_input).")
    retry_after = serializers.IntegerField(required=False, help_text="Seconds (429/503).")
    scope = serializers.CharField(required=False, help_text="member or tenant (429).")


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


class InstructionsSerializer(serializers.Serializer):
    instructions = serializers.CharField(
        allow_blank=True, help_text="Tenant-wide text that opens every member's system turn.")
    version = serializers.IntegerField(source="instructions_version")


class InstructionsWriteSerializer(StrictSerializer):
    """PUT /api/tenant/instructions: unknown fields are refused (a 400 naming them)."""

    instructions = StrictCharField(allow_blank=True, trim_whitespace=False,
                                   max_length=INSTRUCTIONS_MAX_CHARS, pattern=NO_NUL)
    expected_version = StrictIntegerField(
        required=False, min_value=1,
        help_text="Refuse with 409 if the instructions changed since this version was read.")
