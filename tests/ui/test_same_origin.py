"""No page of the registry fetches anything from another origin, and Swagger UI's "Try it out"
works with a token: headless Chromium sees every request of /, /docs, /redoc and every UI page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from tests.ui.conftest import Seed, Server, close_page, new_page, sign_in
from tests.ui.test_pages import open_page, pages

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Request

pytestmark = pytest.mark.browser


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def recording(page: Page) -> list[str]:
    seen: list[str] = []

    def record(request: Request) -> None:
        if urlsplit(request.url).scheme not in {"data", "blob", "about"}:
            seen.append(request.url)

    page.on("request", record)
    return seen


def test_every_page_loads_everything_from_its_own_origin(
    browser: Browser, ui_server: Server, seed: Seed
) -> None:
    page = new_page(browser, ui_server)
    seen = recording(page)
    try:
        page.goto("/docs")
        page.locator(".swagger-ui .opblock").first.wait_for()
        page.goto("/redoc")
        # ReDoc's sidebar shows a Redocly logo once the document is rendered: the image that
        # came from cdn.redoc.ly.
        logo = page.locator("img[alt='redocly logo']")
        logo.wait_for(state="attached")
        page.wait_for_load_state("networkidle")
        assert str(logo.get_attribute("src")).startswith("/docs/static/")
        sign_in(page, ui_server.token)
        for _, url in pages(seed):
            open_page(page, url)
    finally:
        close_page(page)
    assert any(u.endswith("/redoc.standalone.js") for u in seen)
    assert any("/docs/static/favicon.png" in u for u in seen)
    assert any("/ui/js/app.js" in u for u in seen) and any("/api/v1/" in u for u in seen)
    foreign = sorted({u for u in seen if origin(u) != ui_server.url})
    assert foreign == [], foreign


def test_swagger_authorize_then_try_it_out_answers_200(browser: Browser, ui_server: Server) -> None:
    page = new_page(browser, ui_server)
    try:
        page.goto("/docs")
        page.get_by_role("button", name="Authorize").first.click()
        dialog = page.locator(".modal-ux")
        dialog.locator("input").first.fill(ui_server.token)
        dialog.locator("button.authorize").click()  # named "Apply credentials"
        dialog.locator("button.btn-done").click()
        path = page.locator(".opblock-summary-path[data-path='/api/v1/tokens/self']")
        operation = page.locator(".opblock-get").filter(has=path).first
        operation.locator(".opblock-summary").first.click()
        operation.get_by_role("button", name="Try it out").click()
        with page.expect_response(lambda r: r.url.endswith("/api/v1/tokens/self")) as answer:
            operation.get_by_role("button", name="Execute").click()
        assert answer.value.status == 200
        assert answer.value.request.headers["authorization"] == f"Bearer {ui_server.token}"
    finally:
        close_page(page)
