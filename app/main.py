"""create_app(): the API process (routers, lifespan resources, errors, UI)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from app import __version__
from app.aliases.router import router as aliases_router
from app.audit.router import router as audit_router
from app.blobs.router import router as blobs_router
from app.db import create_engine, make_sessionmaker
from app.errors import install_error_handlers
from app.jobs.queue import CelerySender, TaskSender
from app.middleware import RequestContextMiddleware
from app.models.router import router as models_router
from app.settings import Settings, get_settings
from app.storage.registry import StorageRegistry
from app.system.router import router as system_router
from app.tokens.router import router as tokens_router
from app.versions.router import router as versions_router

log = logging.getLogger("tensor_registry")

FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend"


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
        app.state.storages = StorageRegistry(settings)
        app.state.broker_check = _broker_check(settings)
        if task_sender is not None:
            app.state.task_sender = task_sender
        else:
            from workers.celery_app import make_celery

            app.state.task_sender = CelerySender(make_celery(settings))
        try:
            yield
        finally:
            await app.state.storages.close()
            await engine.dispose()

    app = FastAPI(
        title="tensor-registry",
        version=__version__,
        summary="Model registry for tensorizer-serialized LLM weights.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    for router in (
        models_router,
        versions_router,
        aliases_router,
        tokens_router,
        audit_router,
        system_router,
    ):
        app.include_router(router)
    app.include_router(blobs_router)
    _mount_ui(app)
    app.add_middleware(RequestContextMiddleware)
    return app


def _mount_ui(app: FastAPI) -> None:
    index = FRONTEND_DIR / "index.html"
    if not index.exists():
        return
    app.mount("/ui", StaticFiles(directory=FRONTEND_DIR, html=True), name="ui")

    @app.get("/", include_in_schema=False)
    async def root() -> FileResponse:
        return FileResponse(index)
