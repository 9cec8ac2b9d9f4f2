"""/docs (Swagger UI) and /redoc served from the package, so they work without internet.

FastAPI's defaults load Swagger UI, ReDoc, Google Fonts and a favicon from CDNs: offline (an
air-gapped cluster, a laptop on a plane) the pages stay blank. The same pages here point at
the dist files that the ``fastapi-offline`` package ships (Swagger UI 5, ReDoc 2, MIT/Apache
licensed, their licenses in that package).

ReDoc's bundle also shows a Redocly logo that it loads from ``cdn.redoc.ly``; the bundle is
served here with that one URL pointed at this server's own image, so no page of the registry
fetches anything from another origin (tests/ui/test_same_origin.py).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs/static"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
REDOC_JS = "redoc.standalone.js"
REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
LOCAL_LOGO = f"{ASSETS_URL}/favicon.png".encode()


def local_redoc_bundle() -> bytes:
    """ReDoc's bundle with its one remote image (the sidebar's Redocly logo) made local."""
    return (ASSETS_DIR / REDOC_JS).read_bytes().replace(REDOC_CDN_LOGO, LOCAL_LOGO)


# The docs pages run FastAPI's inline start-up scripts, so their CSP does not restrict scripts;
# it forbids framing them (clickjacking a token-holding page) and sniffing.
DOCS_HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'none'; object-src 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}


def framed_never(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(DOCS_HEADERS)
    return page


def mount_docs(app: FastAPI) -> None:
    """Add /docs, its OAuth2 redirect page, /redoc and their assets (FastAPI's own are off)."""
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return framed_never(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=f"{app.title} - Swagger UI",
                oauth2_redirect_url=redirect_url,
                swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
                swagger_ui_parameters=app.swagger_ui_parameters,
            )
        )

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return framed_never(get_swagger_ui_oauth2_redirect_html())

    redoc_bundle = local_redoc_bundle()

    # Before the mount, so this route answers for the bundle instead of the file.
    @app.get(f"{ASSETS_URL}/{REDOC_JS}", include_in_schema=False)
    async def redoc_js() -> Response:
        return Response(
            redoc_bundle,
            media_type="text/javascript",
            headers={"Cache-Control": "public, max-age=3600"},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return framed_never(
            get_redoc_html(
                openapi_url=openapi_url,
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{ASSETS_URL}/{REDOC_JS}",
                redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
                with_google_fonts=False,
            )
        )

    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
