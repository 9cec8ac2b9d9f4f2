"""The UI as files: served by the API at / and /ui with a same-origin CSP, and nothing in
tensor_registry_server/ui/ points at another host (no CDN, no web fonts, no analytics). No browser
needed."""

from __future__ import annotations

import re

import httpx

from tensor_registry_server.main import FRONTEND_DIR

EXTERNAL_URL = re.compile(
    r"""(?:https?:)?//(?!127\.0\.0\.1|localhost)[a-z0-9.-]+\.[a-z]{2,}""", re.I
)


async def test_index_and_modules_are_served_with_a_same_origin_csp(
    client: httpx.AsyncClient,
) -> None:
    for path in ("/", "/ui/"):
        r = await client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="/ui/js/app.js">' in r.text
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        # Scripts only from the UI's own files, not all of 'self' (tenant bytes are served on
        # this origin too: issue 33 §5).
        assert re.search(r"script-src http://[a-z0-9.-]+:\*/ui/js/;", csp), csp
        assert r.headers["cache-control"] == "no-cache"
    r = await client.get("/ui/js/app.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert (await client.head("/")).status_code == 200

    missing = await client.get("/ui/js/nope.js")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"


def test_frontend_files_reference_no_other_host() -> None:
    offenders = {}
    for path in FRONTEND_DIR.rglob("*"):
        if path.suffix in {".html", ".js", ".css", ".svg"}:
            # An XML namespace is a name, not a request.
            text = re.sub(r'xmlns="[^"]*"', "", path.read_text())
            found = [m.group(0) for m in EXTERNAL_URL.finditer(text)]
            if found:
                offenders[str(path.relative_to(FRONTEND_DIR))] = found
    assert offenders == {}
