"""Issue 36 §2: the admin's Limits page in Chromium shows each namespace's usage against its
limits (who is near one) and sets a namespace's limits through the API."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import pytest

from tests.ui.conftest import Server

try:
    from playwright.sync_api import expect
except ImportError:  # the conftest skips these tests without Playwright
    expect = None

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.browser


def test_the_limits_page_shows_who_is_near_a_limit_and_sets_limits(
    signed_in: Page, ui_server: Server
) -> None:
    api = ui_server.api
    ns = f"lim{secrets.token_hex(3)}"
    model = api.post("/models", json={"name": f"{ns}/m"}).json()
    version = api.post(f"/models/{model['id']}/versions", json={}).json()["version"]
    r = api.put(
        f"/models/{model['id']}/versions/{version}/files/config.json",
        content=b"x" * 100,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 201, r.text
    assert api.put(f"/namespaces/{ns}/limits", json={"storage_bytes": 105}).status_code == 200

    signed_in.get_by_role("link", name="Limits").click()
    signed_in.get_by_role("heading", level=1, name="Limits").wait_for()
    row = signed_in.locator(f'tr[data-namespace="{ns}"]')
    expect(row).to_contain_text("100 B of 105 B")
    expect(row).to_contain_text("near limit")

    signed_in.get_by_role("textbox", name="Namespace").fill(ns)
    signed_in.get_by_role("spinbutton", name="Storage quota (bytes)").fill("1000")
    signed_in.get_by_role("spinbutton", name="Concurrent jobs").fill("4")
    signed_in.get_by_role("button", name="Save limits").click()
    expect(row).to_contain_text("100 B of 1.0 kB")
    expect(row).to_contain_text("0 of 4")
    expect(row.locator(".badge")).to_have_text("ok")
    limits = api.get(f"/namespaces/{ns}/usage").json()["limits"]
    assert limits == {"storage_bytes": 1000, "upload_bytes": None, "concurrent_jobs": 4}
    # Over the quota now: the refusal the page warned about.
    r = api.put(
        f"/models/{model['id']}/versions/{version}/files/big.json",
        content=b"y" * 901,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 507 and r.json()["code"] == "storage_quota_exceeded"
