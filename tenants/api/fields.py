"""Strict JSON fields for the API: a value of the wrong JSON type is refused (400), never
coerced (DRF's own fields turn ``42`` into ``"42"`` and ``"5"`` into ``5``).

Bounds are checked on the value as sent, so what the OpenAPI schema says (``maxLength``,
``pattern``, ``minimum``/``maximum``) is exactly what is accepted.
"""

from __future__ import annotations

import re

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty

# JSON-schema patterns (also enforced here): PostgreSQL text cannot hold NUL.
NO_NUL = r"^[^\x00]*$"
NOT_BLANK_NO_NUL = r"^[^\x00]*[^\x00\s][^\x00]*$"
_FULL_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "Not a valid string."}

    def __init__(self, *, pattern: str | None = None, pattern_message: str = "", **kw):
        super().__init__(**kw)
        if pattern is not None:
            # RegexValidator: enforced, and drf-spectacular publishes it as the pattern
            self.validators.append(RegexValidator(pattern, pattern_message or "Invalid text."))

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)  # before any trimming
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictDateField(serializers.DateField):
    """A calendar day exactly as OpenAPI's ``date`` format (RFC 3339 full-date,
    ``YYYY-MM-DD``): no week dates, no basic ``YYYYMMDD``, no one-digit months."""

    default_error_messages = {"invalid": "Not a date (YYYY-MM-DD)."}

    def get_value(self, dictionary):
        # DRF reads an empty query parameter (``?start=``) as absent; it is a bad date
        return dictionary.get(self.field_name, empty)

    def to_internal_value(self, data):
        if not isinstance(data, str) or not _FULL_DATE.fullmatch(data):
            self.fail("invalid")
        return super().to_internal_value(data)




@extend_schema_field({"type": "number", "minimum": 0, "maximum": 0, "nullable": True,
                      "deprecated": True})
class RemovedFloatField(serializers.Field):
    """A number field of a mechanism the platform removed: absent, null or 0 (what an old
    client sends to mean "off") is accepted and does nothing (the value is ``None``); any
    other value is a 400 naming the field. ``what``: the mechanism, as the error names it;
    ``strings``: a number sent as a string counts as that number (``/v1``'s fields)."""

    default_error_messages = {
        "removed": "{what} was removed from the platform: omit this field (null and 0 are "
                   "accepted and do nothing).",
    }

    def __init__(self, what: str, *, strings: bool = False, **kw):
        self.what, self.strings = what, strings
        super().__init__(required=False, allow_null=True, **kw)

    def to_internal_value(self, data):
        if self.strings and isinstance(data, str):
            try:
                data = float(data)
            except ValueError:
                self.fail("removed", what=self.what)
        if isinstance(data, bool) or not isinstance(data, (int, float)) or data != 0:
            self.fail("removed", what=self.what)
        return None

    def to_representation(self, value):
        return value
