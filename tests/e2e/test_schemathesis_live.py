"""Schemathesis against the live web (real DRF, Postgres, Redis) with a real worker: every
operation, the chat endpoint included, with positive and negative data and all checks,
bounded (examples per operation, request timeout). Rate limits are raised for the run
and the chat bounds lowered so each generated chat is short."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tenants import actions
from tenants.models import Message

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# per operation, in the fuzzing phase; the examples and coverage phases (every documented
# example, each schema's boundary and negative values) do not depend on it
MAX_EXAMPLES = 10


@pytest.fixture
def fuzz_settings(settings):
    settings.CHAT_RATE_PER_MEMBER = settings.CHAT_RATE_PER_TENANT = "100000/min"
    settings.API_RATE_PER_MEMBER = settings.API_RATE_PER_TENANT = "100000/min"
    settings.CHAT_MAX_NEW_TOKENS, settings.CHAT_DEFAULT_MAX_NEW_TOKENS = 4, 2
    settings.CHAT_MAX_MESSAGE_CHARS = 300
    return settings


def test_schemathesis_finds_no_failures(live_server, gpu_worker, fuzz_settings, tmp_path):
    tenant = actions.do_create_tenant("fuzz")
    # a tenant admin: the instructions endpoints are fuzzed too (members get 403 there)
    member = actions.do_add_member(tenant, "fuzz-user", admin=True, preference="likes tests")
    key = actions.do_create_api_token(member)
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run",
        f"{live_server.url}/api/schema/?format=json", "--url", live_server.url,
        "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", "9",
        "--phases", "examples,coverage,fuzzing", "--workers", "1",
        "--request-timeout", "60", "--no-shrink", "--no-color",
        "--generation-database", "none", "--header", f"Authorization: Token {key}",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]
    # 422 is stateful, not a schema mismatch: an Idempotency-Key that schemathesis happens to
    # repeat with another body is "reused" (documented; IETF idempotency-key draft)
    # /v1/chat/completions follows OpenAI's request rules, some beyond what OpenAPI 3.0 states
    # (the last message must be a user message; content is a string or text parts; neutral
    # values only for unsupported penalties): a schema-valid body may get a documented 400
    # there. Every other check (no 5xx, negative data rejected, response schemas) still runs.
    (tmp_path / "schemathesis.toml").write_text(
        '[checks.positive_data_acceptance]\n'
        'expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]\n'
        '[[operations]]\n'
        'include-path = "/v1/chat/completions"\n'
        'checks.positive_data_acceptance.expected-statuses = '
        '["2xx", "3xx", "400", "401", "403", "404", "409", "422", "429", "5xx"]\n'
        )
    env = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    # the same reason: many 400s there are expected, which schemathesis reports as its one
    # "validation mismatch" warning; any other warning or failure fails this test
    warned = out.split("= WARNINGS =", 1)[-1] if "= WARNINGS =" in out else ""
    only_v1_mismatch = ("Schema validation mismatch: 1 operation" in warned
                        and "- POST /v1/chat/completions" in warned
                        and warned.count("⚠️") == 1 and "FAILURES" not in out)
    assert proc.returncode == 0 or only_v1_mismatch, out[-8000:] + gpu_worker.log_tail()
    assert "No issues found" in out or only_v1_mismatch, out[-4000:]
    junit = "".join(p.read_text() for p in tmp_path.glob("junit*.xml"))
    assert "POST /api/chat" in junit and "PATCH /api/preference" in junit
    chats = Message.objects.filter(tenant=tenant, role=Message.Role.ASSISTANT).count()
    assert chats > 0  # generated chats reached the worker and were answered
