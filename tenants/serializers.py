"""Request validation and response shapes of the API (also what the OpenAPI schema shows)."""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from tenants.actions import PREFERENCE_MAX_CHARS
from tenants.models import Conversation, Member, Message, Preference

PK_MAX = 2**63 - 1  # Postgres bigint: larger ids are refused as input, never sent to the DB


class ChatRequestSerializer(serializers.Serializer):
    message = serializers.CharField(
        trim_whitespace=True, allow_blank=False,
        help_text="The user's message (limit: CHAT_MAX_MESSAGE_CHARS characters).",
    )
    conversation = serializers.IntegerField(
        required=False, min_value=1, max_value=PK_MAX,
        help_text="Continue this conversation (one of yours); omit to start a new one.",
    )
    max_new_tokens = serializers.IntegerField(
        required=False, min_value=1, help_text="1..CHAT_MAX_NEW_TOKENS."
    )
    temperature = serializers.FloatField(
        required=False, min_value=0.0, max_value=2.0, help_text="0 = greedy (default)."
    )
    top_p = serializers.FloatField(required=False, min_value=0.01, max_value=1.0)
    alpha = serializers.FloatField(
        required=False, min_value=0.0, max_value=1.0,
        help_text="Injection strength override (values only); capped by the engine's KV_ALPHA_CAP.",
    )

    def validate_message(self, value: str) -> str:
        limit = settings.CHAT_MAX_MESSAGE_CHARS
        if len(value) > limit:
            raise serializers.ValidationError(f"Message is limited to {limit} characters.")
        return value

    def validate_max_new_tokens(self, value: int) -> int:
        if value > settings.CHAT_MAX_NEW_TOKENS:
            raise serializers.ValidationError(
                f"max_new_tokens is limited to {settings.CHAT_MAX_NEW_TOKENS}."
            )
        return value


class UsageSerializer(serializers.Serializer):
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()


class CacheInfoSerializer(serializers.Serializer):
    """K/V figures the worker reports; more engine figures may be present."""

    tier = serializers.ChoiceField(choices=["l1", "l2", "compute", "none"],
                                   help_text="Where the preference K/V came from.")
    content_hash = serializers.CharField(help_text="SHA-256 of the preference text used.")
    preference_version = serializers.IntegerField(allow_null=True)
    fingerprint = serializers.CharField(help_text="Model identity the K/V belongs to.")
    alpha_effective = serializers.FloatField()
    kv_tokens = serializers.IntegerField()
    kv_layers_count = serializers.IntegerField()
    kv_bytes_cpu = serializers.IntegerField()
    kv_fetch_latency_ms = serializers.FloatField()
    inference_latency_ms = serializers.FloatField()


class ChatResponseSerializer(serializers.Serializer):
    reply = serializers.CharField()
    conversation = serializers.IntegerField()
    usage = UsageSerializer()
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


class ConversationDetailSerializer(ConversationSerializer):
    messages = MessageSerializer(many=True, read_only=True)

    class Meta(ConversationSerializer.Meta):
        fields = [*ConversationSerializer.Meta.fields, "messages"]


class PreferenceSerializer(serializers.ModelSerializer):
    """Read shape; writes go through ``actions.do_set_preference``."""

    content_hash = serializers.CharField(read_only=True)

    class Meta:
        model = Preference
        fields = ["text", "enabled", "alpha", "version", "updated_at", "content_hash"]
        read_only_fields = fields


class PreferenceWriteSerializer(serializers.Serializer):
    text = serializers.CharField(allow_blank=True, trim_whitespace=False,
                                 max_length=PREFERENCE_MAX_CHARS)
    enabled = serializers.BooleanField(required=False)
    alpha = serializers.FloatField(required=False, min_value=0.0, max_value=1.0)


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
