"""/docs (Swagger UI) and /redoc served from the package, so they work without internet.

FastAPI's defaults load Swagger UI, ReDoc, Google Fonts and a favicon from CDNs: offline (an
air-gapped cluster, a laptop on a plane) the pages stay blank. The same pages here point at
the dist files that the ``fastapi-offline`` package ships (Swagger UI 5, ReDoc 2, MIT/Apache
licensed, their licenses in that package).
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
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs/static"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))


def mount_docs(app: FastAPI) -> None:
    """Add /docs, its OAuth2 redirect page, /redoc and their assets (FastAPI's own are off)."""
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=redirect_url,
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )

    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
