"""create_app(): the API process (routers, lifespan resources, errors, UI)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers
from starlette.types import Scope

from tensor_registry_server import __version__
from tensor_registry_server.aliases.router import router as aliases_router
from tensor_registry_server.artifacts.router import router as artifacts_router
from tensor_registry_server.audit.router import router as audit_router
from tensor_registry_server.auth import PrincipalCache
from tensor_registry_server.blobs.router import router as blobs_router
from tensor_registry_server.core.choice_cache import bind_cache, build_cache
from tensor_registry_server.core.db import create_engine, make_sessionmaker
from tensor_registry_server.core.errors import install_error_handlers
from tensor_registry_server.core.event_hub import EventHub, events_channel
from tensor_registry_server.core.events_outbox import bind_event_notifier
from tensor_registry_server.core.queue import CelerySender, TaskSender
from tensor_registry_server.events.router import router as events_router
from tensor_registry_server.hf_door.router import router as hf_door_router
from tensor_registry_server.jobs.pool.router import router as worker_pool_router
from tensor_registry_server.jobs.router import router as jobs_router
from tensor_registry_server.key_delivery.router import router as key_delivery_router
from tensor_registry_server.limits.rate import RateLimitMiddleware, build_buckets
from tensor_registry_server.limits.router import router as limits_router
from tensor_registry_server.middleware import RequestContextMiddleware
from tensor_registry_server.models.router import router as models_router
from tensor_registry_server.nodes.router import router as nodes_router
from tensor_registry_server.oci_door.router import router as oci_door_router
from tensor_registry_server.openapi import install_openapi
from tensor_registry_server.resolve.audit_buffer import AuditBuffer
from tensor_registry_server.resolve.router import router as resolve_router
from tensor_registry_server.retention.router import router as retention_router
from tensor_registry_server.settings import Settings, get_settings
from tensor_registry_server.sso.router import router as sso_router
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.system.docs import mount_docs
from tensor_registry_server.system.router import router as system_router
from tensor_registry_server.system.ui_vocabulary import vocabulary_js
from tensor_registry_server.tokens.router import router as tokens_router
from tensor_registry_server.trust.router import router as trust_router
from tensor_registry_server.versions.router import router as versions_router
from tensor_registry_server.webhooks.delivery import Deliverer
from tensor_registry_server.webhooks.router import router as webhooks_router

log = logging.getLogger("tensor_registry")

FRONTEND_DIR = Path(__file__).resolve().parent / "ui"


def _broker_check(settings: Settings) -> Callable[[], Awaitable[None]]:
    if settings.embedded_broker:

        async def check_dir() -> None:
            folder = settings.broker_dir / "out"
            if not await asyncio.to_thread(folder.is_dir):
                raise ConnectionError(f"broker folder {folder} is missing")

        return check_dir

    async def check_remote() -> None:
        from kombu import Connection

        def ping() -> None:
            with Connection(settings.broker_url, connect_timeout=2) as conn:
                conn.ensure_connection(max_retries=1)

        await asyncio.to_thread(ping)

    return check_remote


def create_app(
    settings: Settings | None = None, *, task_sender: TaskSender | None = None
) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_engine(
            settings.database_url,
            echo=settings.database.echo,
            pool_size=settings.database.pool_size,
        )
        app.state.settings = settings
        app.state.engine = engine
        app.state.sessionmaker = make_sessionmaker(engine)
        app.state.resolve_cache = build_cache(
            settings.broker.redis_url,
            ttl_seconds=settings.broker.resolve_cache_ttl_seconds,
            key_prefix=settings.broker.key_prefix,
        )
        bind_cache(app.state.sessionmaker, app.state.resolve_cache)
        app.state.event_hub = EventHub(
            app.state.sessionmaker,
            redis_url=settings.broker.redis_url,
            channel=events_channel(settings),
            poll_seconds=settings.events.poll_seconds
            if settings.broker.redis_url
            else settings.events.embedded_poll_seconds,
        )
        await app.state.event_hub.start()
        bind_event_notifier(app.state.sessionmaker, app.state.event_hub.notify)
        app.state.webhook_deliverer = None
        if settings.webhooks.deliver:
            app.state.webhook_deliverer = Deliverer(app.state.sessionmaker, settings)
            app.state.webhook_deliverer.start(app.state.event_hub)
        app.state.resolve_audit = AuditBuffer(
            engine,
            flush_interval=settings.audit.flush_seconds,
            wal_dir=settings.audit_wal_dir,
            sweep_seconds=settings.audit.sweep_seconds,
        )
        app.state.resolve_audit.start()
        app.state.principal_cache = PrincipalCache()
        app.state.storages = StorageRegistry(settings)
        app.state.broker_check = _broker_check(settings)
        if task_sender is not None:
            app.state.task_sender = task_sender
        else:
            from tensor_registry_server.core.broker import make_celery

            app.state.task_sender = CelerySender(make_celery(settings))
        try:
            yield
        finally:
            if app.state.webhook_deliverer is not None:
                await app.state.webhook_deliverer.close()
            await app.state.event_hub.close()
            await app.state.storages.close()
            await app.state.resolve_audit.close()
            if app.state.resolve_cache is not None:
                await app.state.resolve_cache.close()
            await engine.dispose()

    app = FastAPI(
        title="tensor-registry",
        version=__version__,
        summary="Model registry for tensorizer-serialized LLM weights.",
        lifespan=lifespan,
        # Served from the package by mount_docs: FastAPI's own pages load from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    # First: resolve is the hot path of a fleet rollout, and routes are matched in order.
    app.include_router(resolve_router)
    for router in (
        models_router,
        versions_router,
        aliases_router,
        tokens_router,
        audit_router,
        limits_router,
        sso_router,
        system_router,
    ):
        app.include_router(router)
    app.include_router(blobs_router)
    app.include_router(key_delivery_router)
    app.include_router(artifacts_router)
    app.include_router(jobs_router)
    app.include_router(worker_pool_router)
    app.include_router(events_router)
    app.include_router(webhooks_router)
    app.include_router(nodes_router)
    app.include_router(retention_router)
    mount_docs(app)
    app.include_router(trust_router)
    app.include_router(oci_door_router)
    app.include_router(hf_door_router)
    _mount_ui(app)
    install_openapi(app)
    # Inside the request context: a 429 still gets its request id, log line and metrics.
    app.add_middleware(RateLimitMiddleware, buckets=build_buckets(settings))
    app.add_middleware(RequestContextMiddleware, trusted_proxies=settings.security.trusted_proxies)
    return app


def _mount_ui(app: FastAPI) -> None:
    """The web UI: static ES modules from tensor_registry_server/ui/ (no build step) at /ui,
    index.html at /.

    The CSP keeps the page to this origin (no CDN, fonts or analytics can load), and
    no-cache makes browsers revalidate (ETag) so an upgraded server never runs a stale UI.
    """
    index = FRONTEND_DIR / "index.html"
    if not index.exists():
        return

    class UiFiles(StaticFiles):
        async def get_response(self, path: str, scope: Scope) -> Response:
            response = await super().get_response(path, scope)
            response.headers.update(ui_headers(Headers(scope=scope).get("host")))
            return response

    vocabulary = vocabulary_js()

    @app.api_route("/ui/js/vocabulary.js", methods=["GET", "HEAD"], include_in_schema=False)
    async def ui_vocabulary(request: Request) -> Response:
        headers = ui_headers(request.headers.get("host"))
        return Response(vocabulary, media_type="text/javascript", headers=headers)

    app.mount("/ui", UiFiles(directory=FRONTEND_DIR, html=True), name="ui")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root(request: Request) -> FileResponse:
        return FileResponse(index, headers=ui_headers(request.headers.get("host")))


# A Host header that can stand in a CSP source expression as it is (a name or an address).
_CSP_HOST = re.compile(r"^(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])$")


def ui_headers(host: str | None) -> dict[str, str]:
    """The UI's headers. Its scripts come only from its own files under /ui/js/ (a host source
    with that path, for the host the browser asked: any port, and `http` matches https too),
    not from all of 'self': tenant bytes are served on this origin too (the doors, signed
    blob URLs), and with a path a tenant's .js there never matches `script-src`."""
    name = (host or "").rsplit(":", 1)[0] if not (host or "").endswith("]") else host or ""
    scripts = f"http://{name}:*/ui/js/" if name and _CSP_HOST.match(name) else "'self'"
    return {
        "Cache-Control": "no-cache",
        "Content-Security-Policy": (
            f"default-src 'self'; script-src {scripts}; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
            "form-action 'self'; frame-ancestors 'none'"
        ),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
