"""CSV downloads for admin pages: streamed, so a big audit log never sits in memory."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence

from django.http import StreamingHttpResponse


class _Echo:
    def write(self, value: str) -> str:
        return value


def _safe(value) -> str:
    """Neutralise spreadsheet formulas (CSV injection) in user-controlled cells."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_response(filename: str, header: Sequence[str],
                 rows: Iterable[Sequence]) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())

    def lines():
        yield writer.writerow(header)
        for row in rows:
            yield writer.writerow([_safe(v) for v in row])

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
