"""The headless Chromium the browser tests share: one per test module, and a tab per test whose script errors fail
it. A module that needs another setup (a served site, its own context) defines its own fixture of the name."""

import pytest

from tests.web.test_browser import launch_chromium


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless chromium with a fresh profile; the test fails (it does not skip) when chromium is missing."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = launch_chromium(
            playwright, tmp_path_factory.mktemp("chromium-profile"), viewport={"width": 1100, "height": 900}
        )
        yield context
        context.close()


@pytest.fixture
def page(browser):
    """A new tab whose uncaught script errors fail the test."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    tab.close()
    assert not errors, f"the page threw: {errors}"
