"""Strict limit/offset pagination: a bad ``limit`` or ``offset`` is a 400, never ignored."""

from __future__ import annotations

import re

from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

from tenants.api.serializers import PK_MAX

DEFAULT_LIMIT, MAX_LIMIT = 20, 100
_DIGITS = re.compile(r"[0-9]{1,19}")

PARAMETERS = [
    OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                     description=f"Page size (default {DEFAULT_LIMIT})."),
    OpenApiParameter("offset", {"type": "integer", "minimum": 0, "maximum": PK_MAX},
                     description="Items to skip (default 0)."),
]


def _query_int(request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not lo <= int(raw) <= hi:
        raise ValidationError({name: [f"Must be an integer from {lo} to {hi}."]})
    return int(raw)


class StrictLimitOffsetPagination(LimitOffsetPagination):
    default_limit, max_limit = DEFAULT_LIMIT, MAX_LIMIT

    def get_limit(self, request) -> int:
        return _query_int(request, self.limit_query_param, DEFAULT_LIMIT, 1, MAX_LIMIT)

    def get_offset(self, request) -> int:
        return _query_int(request, self.offset_query_param, 0, 0, PK_MAX)
