"""Shapes of ``/api/memories``: strict JSON types, unknown fields refused (400 naming them)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.api.fielddocs import MEMORY_RULES
from tenants.api.fields import (
    NOT_BLANK_NO_NUL,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
)
from tenants.models import Memory
from tenants.rules import memory_shown


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know (a typo is an error, never silently ignored)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class StrictSerializerSchema(OpenApiSerializerExtension):
    """The schema says it too: ``additionalProperties: false``."""

    target_class = StrictSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_basic_serializer(self.target, direction)
        return {**schema, "additionalProperties": False}


@extend_schema_field({"type": "string", "minLength": 1, "pattern": NOT_BLANK_NO_NUL})
class MemoryTextField(StrictCharField):
    """Bounded by MEMORY_MAX_CHARS when the serializer is built."""


class MemoryWriteSerializer(StrictSerializer):
    """A memory's fields (PATCH: any of them)."""

    enabled = StrictBooleanField(required=False, help_text="Used in replies (default true).")
    pinned = StrictBooleanField(required=False, help_text="Always in your cached segment "
                                                          "(default false).")

    def get_fields(self):
        fields = super().get_fields()
        limit = settings.MEMORY_MAX_CHARS
        fields["text"] = MemoryTextField(
            max_length=limit, trim_whitespace=False, pattern=NOT_BLANK_NO_NUL,
            pattern_message="Text is blank or contains NUL characters.",
            error_messages={"max_length": f"A memory is limited to {limit} characters."},
            help_text=f"Not blank, at most {limit} characters (MEMORY_MAX_CHARS).")
        return fields


class MemoryPatchSerializer(MemoryWriteSerializer):
    """PATCH: a memory's fields and its rules' switch."""

    rules_enabled = StrictBooleanField(required=False, help_text=MEMORY_RULES["rules_enabled"])


class RulesSerializer(serializers.Serializer):
    """The rules read from a text, and whether they are applied."""

    constraints = serializers.ListField(
        child=serializers.CharField(), help_text="Decoding constraints, e.g. `lowercase`, "
                                                 "`no_comma`, `ban:<word>`, `max_words:<k>`.")
    language = serializers.CharField(allow_null=True, help_text="The language replies are "
                                                                "guided toward, else null.")
    standing = serializers.BooleanField(help_text="An instruction on how to answer, re-stated "
                                                  "by the memory reminder.")
    enabled = serializers.BooleanField(help_text="false: switched off (none of it applied).")


def rules_field() -> serializers.SerializerMethodField:
    return serializers.SerializerMethodField(help_text=MEMORY_RULES["rules"])


class MemoryOrderSerializer(StrictSerializer):
    """The new order of all your memories."""

    order = serializers.ListField(
        child=StrictIntegerField(min_value=1), allow_empty=True,
        help_text="Each of your memory ids exactly once, in the new order.")


class MemorySerializer(serializers.ModelSerializer):
    """Read shape; writes go through ``tenants.actions.memories``."""

    rules = rules_field()

    class Meta:
        model = Memory
        fields = ["id", "text", "enabled", "pinned", "position", "source", "rules",
                  "created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(RulesSerializer)
    def get_rules(self, obj: Memory) -> dict:
        return memory_shown(obj)


class MemoryListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    limit = serializers.IntegerField(help_text="Most memories you may have "
                                               "(MEMORY_MAX_PER_MEMBER).")
    results = MemorySerializer(many=True)
