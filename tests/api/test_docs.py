"""/docs and /redoc work offline: every asset they load comes from this server."""

from __future__ import annotations

import re

import httpx
import pytest

ASSET_RE = re.compile(r"""(?:src|href)=["']([^"']+)["']""")


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("/docs", {"text/javascript": 1, "text/css": 1, "image/png": 1}),
        ("/redoc", {"text/javascript": 1, "image/png": 1}),
    ],
)
async def test_docs_pages_load_only_local_assets(
    anon: httpx.AsyncClient, page: str, expected: dict[str, int]
) -> None:
    r = await anon.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    # No CDN, no Google Fonts, no remote favicon: nothing here names another host.
    assert "://" not in html.replace("window.location.origin", ""), html
    assert "fonts.googleapis" not in html
    assets = ASSET_RE.findall(html)
    seen: dict[str, int] = {}
    for url in assets:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = await anon.get(url)
        assert asset.status_code == 200, url
        media = asset.headers["content-type"].split(";")[0]
        seen[media] = seen.get(media, 0) + 1
        if media == "text/javascript":
            assert len(asset.content) > 100_000 and b"function" in asset.content[:2000]
        if media == "text/css":
            assert b".swagger-ui" in asset.content
    assert seen == expected, assets


async def test_docs_render_the_registry_openapi_document(anon: httpx.AsyncClient) -> None:
    html = (await anon.get("/docs")).text
    assert "url: '/openapi.json'" in html
    assert '<redoc spec-url="/openapi.json">' in (await anon.get("/redoc")).text
    assert (await anon.get("/docs/oauth2-redirect")).status_code == 200
    spec = (await anon.get("/openapi.json")).json()
    assert "/docs" not in spec["paths"] and "/api/v1/resolve" in spec["paths"]
    # Public for anyone: this client carries no token (the API itself would answer 401).
    assert (await anon.get("/api/v1/models")).status_code == 401


@pytest.mark.parametrize("page", ["/docs", "/redoc", "/docs/oauth2-redirect"])
async def test_docs_pages_cannot_be_framed_or_sniffed(anon: httpx.AsyncClient, page: str) -> None:
    """Issue 33 §5: /docs and /redoc sent no CSP and could be framed."""
    r = await anon.get(page)
    assert r.status_code == 200
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
