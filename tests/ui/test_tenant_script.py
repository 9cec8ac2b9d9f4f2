"""Tenant bytes never run as the UI's script (issue 33 §5): a tenant's payload.js served by the
HF door on the UI's origin ran when loaded with `<script src>`. Now the UI's script-src names
only its own files (/ui/js/), and tenant bytes come with nosniff, `attachment` and a sandboxing
CSP. Real Chromium, the request carrying the token (as a page holding one could make it)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.hf_fixtures import make_tiny_gpt2
from tests.ui.conftest import Server, publish

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = pytest.mark.browser

PAYLOAD = b"window.__tenantRan = (window.__tenantRan || 0) + 1;\n"


def test_a_tenant_js_served_by_the_hf_door_does_not_run(
    browser: Browser, ui_server: Server, tmp_path: Path
) -> None:
    api = ui_server.api
    directory = make_tiny_gpt2(tmp_path / "tiny")
    (directory / "payload.js").write_bytes(PAYLOAD)
    name = f"acme/script-{secrets.token_hex(3)}"
    model = api.post("/models", json={"name": name}).json()
    publish(api, model["id"], directory, finalize=True)
    url = f"/{name}/resolve/main/payload.js"

    direct = api.get(f"{ui_server.url}{url}")
    assert direct.status_code == 200 and direct.content == PAYLOAD
    assert direct.headers["x-content-type-options"] == "nosniff"
    assert direct.headers["content-disposition"].startswith("attachment")
    assert direct.headers["content-security-policy"] == "default-src 'none'; sandbox"
    assert "javascript" not in direct.headers["content-type"]

    context = browser.new_context(
        base_url=ui_server.url,
        extra_http_headers={"Authorization": f"Bearer {ui_server.token}"},
    )
    try:
        page = context.new_page()
        violations: list[str] = []
        page.on(
            "console",
            lambda msg: (
                violations.append(msg.text) if "Content Security Policy" in msg.text else None
            ),
        )
        page.goto("/")
        page.get_by_label("API token").wait_for()  # the UI's own modules ran
        outcome = page.evaluate(
            """(src) => new Promise((done) => {
              const s = document.createElement('script');
              s.src = src;
              s.onload = () => done('load');
              s.onerror = () => done('error');
              document.head.append(s);
              setTimeout(() => done('timeout'), 10000);
            })""",
            url,
        )
        ran = page.evaluate("() => window.__tenantRan ?? 0")
        assert ran == 0, "a tenant's script ran on the UI's origin"
        assert outcome == "error", outcome
        assert any("script-src" in v for v in violations), violations
        # The UI's own module graph still loads under the narrowed policy.
        assert page.evaluate("async () => typeof (await import('/ui/js/markdown.js')).inline")
    finally:
        context.close()
