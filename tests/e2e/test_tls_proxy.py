"""Behind a TLS-terminating proxy (docs/OPERATIONS.md, "Behind a TLS proxy"): a real nginx
in front of two web processes, one started with the proxy settings and one without.

Through https:// the admin login works on the configured web (secure cookies, HSTS, a
foreign Origin still refused) and is refused by Django's CSRF origin check on the other,
which sees a plain-http request posted from an https origin; a /v1 stream passes the proxy
chunk by chunk to its [DONE].
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.tlsproxy import TlsProxy, nginx_path
from tests.workers import AsgiServer

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

if nginx_path() is None:
    pytest.skip("no nginx installed (apt-get install -y nginx-light; .ci/run does it)",
                allow_module_level=True)

PROXY_SETTINGS = {"DJANGO_SECURE_PROXY_SSL_HEADER": "on", "DJANGO_HSTS_SECONDS": "600"}


@pytest.fixture(scope="module")
def behind_tls(worker_base_env, tmp_path_factory):
    """{"plain": (web, https url), "proxied": (web, https url)} and the proxy's CA file."""
    from tests.workers import free_port

    # the configured web's public origin is the proxy's port for it: chosen first
    public_port = free_port()
    origin = f"https://127.0.0.1:{public_port}"
    webs = {
        "plain": AsgiServer(worker_base_env, tmp_path_factory.mktemp("web-plain")),
        "proxied": AsgiServer({**worker_base_env, **PROXY_SETTINGS,
                               "DJANGO_CSRF_TRUSTED_ORIGINS": origin},
                              tmp_path_factory.mktemp("web-proxied")),
    }
    proxy = None
    try:
        proxy = TlsProxy(tmp_path_factory.mktemp("nginx"), [w.port for w in webs.values()],
                         ports={webs["proxied"].port: public_port})
        for web in webs.values():
            web.wait_ready()
        proxy.wait_ready()
        yield {name: (web, proxy.url(web.port)) for name, web in webs.items()}, proxy.cert
    finally:
        if proxy is not None:
            proxy.stop()
        for web in webs.values():
            web.stop()


@pytest.fixture
def admin():
    from tenants import actions

    tenant = actions.do_create_tenant("acme")
    actions.do_add_member(tenant, "acme-admin", admin=True, password="pw-admin-123")


def login(base: str, cafile, origin: str | None = None) -> tuple[requests.Session, object]:
    """A browser's login: the form (its CSRF cookie), then the POST with Origin and Referer."""
    browser = requests.Session()
    browser.trust_env = False  # REQUESTS_CA_BUNDLE would replace the proxy's certificate
    browser.verify = str(cafile)
    form = browser.get(f"{base}/admin/login/?next=/admin/", timeout=30)
    assert form.status_code == 200, form.text[:500]
    response = browser.post(
        f"{base}/admin/login/?next=/admin/", allow_redirects=False, timeout=30,
        data={"username": "acme-admin", "password": "pw-admin-123", "next": "/admin/",
              "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        headers={"Origin": origin or base, "Referer": f"{base}/admin/login/?next=/admin/"})
    return browser, response


def test_the_admin_login_works_over_https_only_with_the_proxy_settings(behind_tls, admin):
    webs, cafile = behind_tls
    plain_web, plain = webs["plain"]
    _, refused = login(plain, cafile)
    assert refused.status_code == 403 and "CSRF" in refused.text, refused.text[:300]
    assert "Origin checking failed" in plain_web.log_tail(), plain_web.log_tail()

    proxied_web, proxied = webs["proxied"]
    browser, response = login(proxied, cafile)
    assert response.status_code == 302, (response.text[:300], proxied_web.log_tail())
    assert response.headers["Location"] == "/admin/"
    cookies = {c.name: c for c in browser.cookies}
    assert cookies["sessionid"].secure and cookies["csrftoken"].secure
    index = browser.get(f"{proxied}/admin/", timeout=30, allow_redirects=False)
    assert index.status_code == 200 and "Log out" in index.text
    assert index.headers["Strict-Transport-Security"] == "max-age=600"

    _, forged = login(proxied, cafile, origin="https://evil.example")
    assert forged.status_code == 403 and "CSRF" in forged.text  # the check still guards


def test_a_v1_stream_passes_the_proxy_to_its_done(behind_tls, gpu_worker, member_key):
    webs, cafile = behind_tls
    _, proxied = webs["proxied"]
    body = {"model": "kvinject", "stream": True, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "What should I cook?"}]}
    with requests.post(f"{proxied}/v1/chat/completions", json=body, stream=True, timeout=120,
                       verify=str(cafile),
                       headers={"Authorization": f"Bearer {member_key[1]}"}) as response:
        assert response.status_code == 200, response.text[:300]
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len(b"data: "):] for line in response.iter_lines()
                  if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert sum(1 for p in pieces if p) >= 2, chunks
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
