"""Browser tests: Playwright for Python driving the system's Chromium (Debian package
``chromium``; no browser download). Without one they are skipped, and the run's header
says so (tests/conftest.py). Screenshots go to var/test-artifacts/browser/."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.workers import ROOT

ARTIFACTS = ROOT / "var" / "test-artifacts" / "browser"
# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
# between page actions are still plain synchronous code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def chromium_path() -> str | None:
    """The system Chromium (CHROMIUM_PATH overrides), or None."""
    for candidate in (os.environ.get("CHROMIUM_PATH"), shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def pytest_collection_modifyitems(config, items):
    if chromium_path() is not None:
        try:
            import playwright.sync_api  # noqa: F401
            return
        except ImportError:
            reason = "playwright is not installed (make install)"
    else:
        reason = "no chromium installed (apt-get install -y chromium)"
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"browser test skipped: {reason}"))


@pytest.fixture(scope="package")  # stopped after tests/browser: its event loop with it
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path(), headless=True,
                                      args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280,
                                                                   "height": 900})
    context.set_default_timeout(30_000)
    pg = context.new_page()
    yield pg
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}-last.png"), full_page=True)
    context.close()


def shot(page, name: str) -> Path:
    """Keep a screenshot as a test artefact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
