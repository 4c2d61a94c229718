"""Behind a TLS-terminating proxy (docs/OPERATIONS.md, "Behind a TLS proxy"): a real nginx
in front of three web processes, as an ingress on another address than uvicorn trusts.

Over https:// the admin login is refused by Django's CSRF origin check on a web without the
proxy settings (it sees a plain-http request posted from an https origin); behind a proxy
that sends its own Host (``proxy_set_header Host $host``: the port dropped) it is refused
on a web with DJANGO_SECURE_PROXY_SSL_HEADER alone and works on one that also trusts the
public origin (DJANGO_CSRF_TRUSTED_ORIGINS): Secure cookies, HSTS, a foreign Origin still
refused. A /v1 stream passes the proxy chunk by chunk to its [DONE].
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.tlsproxy import TlsProxy, nginx_path
from tests.workers import AsgiServer, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

if nginx_path() is None:
    pytest.skip("no nginx installed (apt-get install -y nginx-light; .ci/run does it)",
                allow_module_level=True)

HEADER = {"DJANGO_SECURE_PROXY_SSL_HEADER": "on", "DJANGO_HSTS_SECONDS": "600"}


@pytest.fixture(scope="module")
def behind_tls(worker_base_env, tmp_path_factory):
    """{name: (web, its https url)} and the proxy's certificate (the CA to trust)."""
    public_port = free_port()  # the trusting web's public origin: known before it starts
    envs = {"plain": {}, "header": HEADER,
            "trusting": {**HEADER, "DJANGO_CSRF_TRUSTED_ORIGINS":
                         f"https://127.0.0.1:{public_port}"}}
    webs = {name: AsgiServer({**worker_base_env, **env}, tmp_path_factory.mktemp(f"web-{name}"))
            for name, env in envs.items()}
    proxy = None
    try:
        proxy = TlsProxy(tmp_path_factory.mktemp("nginx"), [w.port for w in webs.values()],
                         ports={webs["trusting"].port: public_port},
                         hosts={webs[n].port: "$host" for n in ("header", "trusting")})
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


def refused_by_the_origin_check(web, response) -> bool:
    return (response.status_code == 403 and "CSRF" in response.text
            and "Origin checking failed" in web.log_tail())


def test_the_admin_login_over_https_needs_the_proxy_settings(behind_tls, admin):
    webs, cafile = behind_tls
    for name in ("plain", "header"):  # no settings; the header without the trusted origin
        web, base = webs[name]
        _, response = login(base, cafile)
        assert refused_by_the_origin_check(web, response), (name, response.text[:300])

    web, base = webs["trusting"]
    browser, response = login(base, cafile)
    assert response.status_code == 302, (response.text[:300], web.log_tail())
    assert response.headers["Location"] == "/admin/"
    cookies = {c.name: c for c in browser.cookies}
    assert cookies["sessionid"].secure and cookies["csrftoken"].secure
    index = browser.get(f"{base}/admin/", timeout=30, allow_redirects=False)
    assert index.status_code == 200 and "Log out" in index.text
    assert index.headers["Strict-Transport-Security"] == "max-age=600"

    _, forged = login(base, cafile, origin="https://evil.example")
    assert forged.status_code == 403 and "CSRF" in forged.text  # the check still guards


def test_a_v1_stream_passes_the_proxy_to_its_done(behind_tls, gpu_worker, member_key):
    webs, cafile = behind_tls
    _, base = webs["trusting"]
    body = {"model": "kvinject", "stream": True, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "What should I cook?"}]}
    with requests.post(f"{base}/v1/chat/completions", json=body, stream=True, timeout=120,
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
