"""The reference matches the code (issue 61).

- Every setting the code reads from the environment is in platform/example.env and in
  docs/OPERATIONS.md's settings reference (found by scanning the source for env reads).
- Every endpoint in docs/API.md's endpoint table resolves in the URLconf with that method,
  and every URL under /api/ and /v1/ is in the table.
- docs/API.md's error table and the code's error family name the same codes.
- The field tables of docs/API.md say what the OpenAPI help texts say (one source:
  ``tenants/api/fielddocs/``).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from django.urls import URLPattern, URLResolver, resolve
from rest_framework.views import APIView

from tenants import errors
from tenants.api import exceptions, fielddocs

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "API.md"
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
EXAMPLE_ENV = ROOT / "platform" / "example.env"
SOURCE = ("config", "tenants", "gpu_worker", "injection")
NOT_SETTINGS = {"config/settings_test.py"}  # the test suite's own wiring
ENV_READ = re.compile(
    r"""(?:os\.environ(?:\.get)?\s*[\[(]|os\.getenv\(|\b_?env(?:_[a-z_]+)?\(|\benv\.get\()"""
    r"""\s*["']([A-Z][A-Z0-9_]+)["']""")
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def env_reads() -> dict[str, str]:
    """Setting name -> the first file that reads it."""
    out: dict[str, str] = {}
    for package in SOURCE:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in NOT_SETTINGS:
                continue
            for name in ENV_READ.findall(path.read_text()):
                out.setdefault(name, rel)
    return out


def section(path: Path, heading: str) -> str:
    """The text under a ``## heading`` up to the next heading of that level or above."""
    text = path.read_text()
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert m, f"{path.name}: no heading '{heading}'"
    level = len(m.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, m.end())
    return text[m.end():end.start() if end else len(text)]


def table_rows(text: str) -> list[list[str]]:
    """Cells of every markdown table row (links reduced to their text)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"\|[-| :]+\|$", line):
            rows.append([LINK.sub(r"\1", c).strip() for c in line.strip().strip("|").split(" | ")])
    return rows


# -- settings -------------------------------------------------------------------------------


def test_the_scanner_finds_settings_of_every_kind_of_read():
    found = env_reads()
    assert found["MEMORY_RECALL_TOP_K"].startswith("config/")  # env_int(...)
    assert found["REDIS_SOCKET_TIMEOUT"] == "config/deadlines.py"  # _env(...)
    assert "KV_CACHE_REDIS_URL" in found  # os.environ.get(...)
    assert "KVI_TEST_REDIS_DB" not in found
    assert len(found) > 80


def test_every_setting_is_in_example_env():
    listed = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", EXAMPLE_ENV.read_text(), re.M))
    missing = sorted(set(env_reads()) - listed)
    assert not missing, f"settings the code reads that platform/example.env lacks: {missing}"


def test_every_setting_is_in_the_operations_settings_reference():
    reference = section(OPERATIONS, "Settings reference")
    named = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", reference))
    missing = sorted(set(env_reads()) - named)
    assert not missing, f"settings missing from OPERATIONS' settings reference: {missing}"


# -- endpoints ------------------------------------------------------------------------------


def documented_endpoints() -> list[tuple[str, str]]:
    """(METHOD, /path) of each entry of API.md's endpoint table."""
    out = []
    for row in table_rows(section(API, "Endpoints"))[1:]:
        out += re.findall(r"`([A-Z]+) (/[^`]*)`", row[0])
    assert len(out) > 15
    return out


def url_routes(patterns=None, prefix: str = "") -> list[str]:
    """Every route of the URLconf, ``<int:pk>`` written ``<id>`` as the docs do."""
    from config import urls

    out = []
    for p in urls.urlpatterns if patterns is None else patterns:
        route = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            out += url_routes(p.url_patterns, route)
        elif isinstance(p, URLPattern):
            out.append("/" + re.sub(r"<\w+:\w+>", "<id>", route))
    return out


@pytest.mark.parametrize("method,path", documented_endpoints(), ids=" ".join)
def test_documented_endpoint_resolves_with_its_method(method, path):
    match = resolve(path.replace("<id>", "1"))
    view = getattr(match.func, "view_class", None) or getattr(match.func, "cls", None)
    if view is not None and issubclass(view, APIView):
        assert hasattr(view, method.lower()), f"{view.__name__} has no {method}"
    else:  # a plain Django view: require_GET and friends keep its methods in a closure
        allowed, func = None, match.func
        while func is not None and allowed is None:
            allowed = inspect.getclosurevars(func).nonlocals.get("request_method_list")
            func = getattr(func, "__wrapped__", None)
        assert allowed is None or method in allowed, f"{path} answers {allowed}, not {method}"


def test_every_api_and_v1_url_is_documented():
    documented = {path for _, path in documented_endpoints()}
    routes = [r for r in url_routes() if r.startswith(("/api/", "/v1/"))]
    assert "/api/usage" in routes
    missing = sorted(set(routes) - documented)
    assert not missing, f"URLs under /api/ and /v1/ missing from docs/API.md's table: {missing}"


# -- error codes ----------------------------------------------------------------------------


def code_error_codes() -> set[str]:
    """Every code the error family, the DRF mapping and the plain views answer with."""
    family = {cls.code for _, cls in inspect.getmembers(errors, inspect.isclass)
              if issubclass(cls, errors.PlatformError) and cls is not errors.PlatformError}
    plain = set(re.findall(r"_body\(\"(\w+)\"", inspect.getsource(exceptions)))
    return family | set(exceptions._DRF_CODES.values()) | plain


def test_error_table_and_code_name_the_same_codes():
    documented = {re.sub(r"`", "", row[1]) for row in table_rows(section(API, "Errors"))[1:]
                  if len(row) == 3 and row[0].isdigit()}
    code = code_error_codes()
    assert {"invalid_period", "engine_unavailable", "server_error"} <= code
    assert not code - documented, f"codes docs/API.md's error table lacks: {code - documented}"
    assert not documented - code, f"documented codes the code never answers: {documented - code}"


# -- field descriptions ---------------------------------------------------------------------


def api_rows() -> dict[str, list[list[str]]]:
    out: dict[str, list[list[str]]] = {}
    for row in table_rows(API.read_text()):
        out.setdefault(row[0], []).append(row[1:])
    return out


@pytest.mark.parametrize("table", ["CHAT_REQUEST", "CHAT_RESPONSE", "V1_EXTENSION",
                                   "V1_REQUEST", "NEUTRAL_V1", "MEMORY_RULES"])
def test_api_md_tables_say_what_the_schema_says(table):
    rows = api_rows()
    wrong = [name for name, text in getattr(fielddocs, table).items()
             if not any(text in cells for cells in rows.get(f"`{name}`", []))]
    assert not wrong, f"docs/API.md rows that differ from fielddocs.{table}: {wrong}"


def test_the_schema_uses_the_shared_descriptions():
    from tenants.api.serializers import CacheInfoSerializer, ChatRequestSerializer, UsageSerializer
    from tenants.v1.shapes import NEUTRAL, CompletionRequestSerializer, ExtensionSerializer

    chat, ext = ChatRequestSerializer().fields, ExtensionSerializer().fields
    for name, text in fielddocs.CHAT_REQUEST.items():
        assert chat[name].help_text == text, name
        if name in ext and name not in fielddocs.V1_EXTENSION:
            assert ext[name].help_text == text, f"kvinject.{name}"
    assert ext["conversation"].help_text == fielddocs.V1_EXTENSION["conversation"]
    v1 = CompletionRequestSerializer().fields
    wrong = [name for name, text in fielddocs.V1_REQUEST.items() if v1[name].help_text != text]
    assert not wrong, f"/v1 fields whose help text is not fielddocs.V1_REQUEST's: {wrong}"
    assert set(v1) == set(fielddocs.V1_REQUEST), "every /v1 field described, and only those"
    assert set(NEUTRAL) == set(fielddocs.NEUTRAL_V1)
    shapes = {"usage": UsageSerializer().fields, "cache": CacheInfoSerializer().fields}
    for dotted, text in fielddocs.CHAT_RESPONSE.items():
        part, name = dotted.split(".")
        assert shapes[part][name].help_text == text, dotted
    from tenants.api.memories.serializers import MemoryPatchSerializer, MemorySerializer
    from tenants.api.serializers import PreferenceSerializer, PreferenceWriteSerializer

    for shape in (MemorySerializer, PreferenceSerializer):
        assert shape().fields["rules"].help_text == fielddocs.MEMORY_RULES["rules"]
    for shape in (MemoryPatchSerializer, PreferenceWriteSerializer):
        assert (shape().fields["rules_enabled"].help_text
                == fielddocs.MEMORY_RULES["rules_enabled"])


def test_field_descriptions_fit_a_table_cell():
    long = [name for table in (fielddocs.CHAT_REQUEST, fielddocs.CHAT_RESPONSE,
                               fielddocs.V1_EXTENSION, fielddocs.V1_REQUEST, fielddocs.NEUTRAL_V1,
                               fielddocs.MEMORY_RULES)
            for name, text in table.items() if len(text.split()) > 40]
    assert not long, f"field descriptions over 40 words: {long}"
