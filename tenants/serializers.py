from __future__ import annotations

from django.conf import settings
from rest_framework import serializers


class ChatRequestSerializer(serializers.Serializer):
    message = serializers.CharField(trim_whitespace=True, allow_blank=False)
    conversation = serializers.IntegerField(required=False, min_value=1)
    max_new_tokens = serializers.IntegerField(required=False, min_value=1)
    temperature = serializers.FloatField(required=False, min_value=0.0, max_value=2.0)
    top_p = serializers.FloatField(required=False, min_value=0.01, max_value=1.0)
    alpha = serializers.FloatField(required=False, min_value=0.0, max_value=1.0)

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


class ChatResponseSerializer(serializers.Serializer):
    reply = serializers.CharField()
    conversation = serializers.IntegerField()
    usage = UsageSerializer()
    cache = serializers.DictField()
    request_id = serializers.CharField()
