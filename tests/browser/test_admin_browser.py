"""The admin in a real browser (system Chromium via Playwright) against a live server and a
real Celery worker: superuser and tenant-admin logins, the playground (an unsaved edit,
then a saved one recomputed), usage and audit CSV downloads, and URL tampering refused."""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.auth import get_user_model

from tests.browser.conftest import shot
from tests.tenants.conftest import make_world
from tests.tenants.test_usage import record

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worlds():
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")
    return make_world("acme", "acme-secret vegetarian, no spicy food"), \
        make_world("globex", "globex-secret loves durian")


def login(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_selector("#kvi-tools")


def download_csv(page, selector: str) -> list[dict]:
    with page.expect_download() as info:
        page.click(selector)
    body = open(info.value.path(), encoding="utf-8").read()
    return list(csv.DictReader(io.StringIO(body)))


def compare(page, message: str) -> dict[str, str]:
    """Both replies stream in side by side; the run is audited once both are done."""
    page.fill("#id_message", message)
    page.click("#kvi-playground-run")
    page.wait_for_selector("#kvi-playground-live[data-state=streaming]", timeout=30_000)
    page.wait_for_selector("#kvi-playground-live[data-state=recorded]", timeout=120_000)
    for v in ("personalised", "plain"):
        assert float(page.inner_text(f"#kvi-{v} .kvi-ttft").split()[0]) > 0
    return {v: page.inner_text(f"#kvi-{v} .kvi-tier") for v in ("personalised", "plain")}


def test_superuser_sees_every_tenant_and_exports_usage(page, live_server, worlds):
    _, globex = worlds
    for tier, latency in (("compute", 400.0), ("l1", 90.0)):  # two stored chats
        record(globex.user, tier=tier, latency=latency, prompt=30, completion=8)
    login(page, live_server.url, "root", "pw-root-123")
    shot(page, "superuser-index")
    page.click("#kvi-tools >> text=Usage")
    assert page.inner_text("#kvi-usage-tenant") == "All tenants"
    page.select_option("select[name=tenant]", "globex")
    page.click("input[value=Show]")
    assert page.inner_text("#kvi-usage-tenant") == "globex"
    assert page.locator("figure.kvi-chart svg").count() == 3
    assert page.locator("figure.kvi-chart rect").count() > 0
    assert page.inner_text("#kvi-usage-members").count("globex/globex-user") == 1
    shot(page, "superuser-usage-globex")
    rows = download_csv(page, "#kvi-usage-csv-day")
    assert len(rows) == 30 and sum(int(r["requests"]) for r in rows) == 2
    assert rows[-1]["hit_rate_l1"] == "50.0%" and rows[-1]["tokens_in"] == "60"  # today
    page.goto(f"{live_server.url}/admin/tenants/auditlog/?q=globex")
    rows = download_csv(page, "a.kvi-export")
    assert rows and any(r["tenant"] == "globex" for r in rows)


@pytest.fixture
def only_w1(gpu_worker):
    """Workers another test file of this pytest process started (e.g. a routing pair) stop
    consuming, so the playground's chats meet one worker's L1 turn after turn."""
    from tests.e2e.conftest import only_these_consume

    with only_these_consume([gpu_worker]):
        yield gpu_worker


def test_tenant_admin_playground_edit_and_recompute(page, live_server, worlds, only_w1):
    acme, _ = worlds
    base = live_server.url
    login(page, base, "acme-admin", "pw-admin-123")
    page.goto(f"{base}/admin/tenants/preference/{acme.user.preference.pk}/change/")
    page.fill("#id_text", "acme: loves very spicy food")  # an unsaved edit
    page.click("#kvi-try-preference")
    assert page.input_value("#id_preference") == "acme: loves very spicy food"
    tiers = compare(page, "What should I cook?")
    assert tiers == {"personalised": "compute", "plain": "none"}
    assert "with the edited, unsaved preference" in page.inner_text("#content-main")
    shot(page, "tenant-admin-playground-unsaved")
    # the saved preference: the member's cache (computed once, then served from L1)
    page.goto(f"{base}/admin/playground/?member={acme.user.pk}")
    assert compare(page, "What should I cook?")["personalised"] in ("compute", "l2")
    assert compare(page, "And for dessert?")["personalised"] == "l1"
    # edit and save the preference: the next reply is recomputed from the new text
    page.goto(f"{base}/admin/tenants/preference/{acme.user.preference.pk}/change/")
    page.fill("#id_text", "acme: pescatarian now")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist")
    page.goto(f"{base}/admin/playground/?member={acme.user.pk}")
    assert page.input_value("#id_preference") == "acme: pescatarian now"
    assert compare(page, "What should I cook?")["personalised"] == "compute"
    shot(page, "tenant-admin-playground-after-edit")
    page.goto(f"{base}/admin/tenants/auditlog/?q=playground")
    rows = download_csv(page, "a.kvi-export")
    assert len(rows) == 4 and {r["actor kind"] for r in rows} == {"admin"}
    assert {r["tenant"] for r in rows} == {"acme"}


def test_url_tampering_shows_the_admin_404(page, live_server, worlds):
    _, globex = worlds
    base = live_server.url
    login(page, base, "acme-admin", "pw-admin-123")
    for path in (f"/admin/tenants/preference/{globex.user.preference.pk}/change/",
                 f"/admin/tenants/member/{globex.user.pk}/change/",
                 f"/admin/tenants/tenant/{globex.tenant.pk}/change/",
                 f"/admin/playground/?member={globex.user.pk}",
                 "/admin/usage/?tenant=globex", "/admin/usage/export.csv?tenant=globex"):
        response = page.goto(base + path)
        assert response.status == 404, path
        assert "404" in page.inner_text("#kvi-error-status")
        assert "globex" not in page.content().replace(path, "")
    shot(page, "tenant-admin-404")
    page.goto(f"{base}/admin/playground/")
    options = page.locator("#id_member option").all_inner_texts()
    assert any("acme" in o for o in options) and not any("globex" in o for o in options)


def test_new_token_is_shown_once_and_copied(page, live_server, worlds):
    acme, _ = worlds
    base = live_server.url
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
    login(page, base, "acme-admin", "pw-admin-123")
    page.goto(f"{base}/admin/tenants/apitoken/add/")
    page.click(".field-member .select2-selection")  # the admin's autocomplete widget
    page.keyboard.type("acme-other")
    page.click(".select2-results__option >> text=acme/acme-other")
    page.fill("#id_name", "browser test")
    page.click("input[name=_save]")
    key = page.input_value("#kvi-new-key")
    assert key.startswith("kvi_")
    page.click("#kvi-copy-key")
    page.wait_for_selector("#kvi-copied:not([hidden])")
    assert page.evaluate("navigator.clipboard.readText()") == key
    shot(page, "tenant-admin-token-created")
    page.click("text=Done")
    # the list page, once loaded (reading #result_list at once could race the navigation)
    page.wait_for_selector("#result_list >> text=browser test")
    listing = page.inner_text("#result_list")
    assert "browser test" in listing and key not in page.content()
