"""Liveness, readiness and Prometheus metrics (no auth: they reveal no registry data), and the
storage backends this registry is configured with (what the UI and CLI may offer)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import Field
from sqlalchemy import text

from tensor_registry_server.auth import ReadToken
from tensor_registry_server.core.schemas import Schema
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.jobs.pool import embedded
from tensor_registry_server.jobs.pool.service import live_worker_ids
from tensor_registry_server.system.metrics import DatabaseMetrics

router = APIRouter(tags=["system"])

CHECK_TIMEOUT = 3.0


class StorageDown(Exception):
    """Which configured backends failed their check (names and error types only)."""


class StorageBackendsOut(Schema):
    default: str = Field(description="The backend used when a request names none.")
    configured: list[str] = Field(
        description="Backends jobs, uploads and imports may name; any other is refused "
        "(422 storage_not_configured)."
    )


@router.get("/api/v1/storage", response_model=StorageBackendsOut)
async def storage_backends(_: ReadToken, settings: SettingsDep) -> StorageBackendsOut:
    return StorageBackendsOut(
        default=settings.storage.default_backend, configured=settings.storage.configured
    )


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state
    checks: dict[str, str] = {}

    async def database() -> None:
        async with state.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def storage() -> None:
        # Every configured backend: resolve refuses URLs into one found down here.
        failed = []
        for name in state.storages.configured():
            try:
                await state.storages.check(name)
            except Exception as exc:
                failed.append(f"{name}: {type(exc).__name__}")
        if failed:
            raise StorageDown("; ".join(failed))

    async def broker() -> None:
        await state.broker_check()

    for name, check in (("database", database), ("storage", storage), ("broker", broker)):
        try:
            await asyncio.wait_for(check(), CHECK_TIMEOUT * (3 if name == "storage" else 1))
            checks[name] = "ok"
        except StorageDown as exc:
            checks[name] = f"unavailable: {exc}"
        except Exception as exc:
            checks[name] = f"unavailable: {type(exc).__name__}"
    body: dict[str, object] = {"checks": checks}
    supervised = embedded.current()
    if supervised is not None:
        # serve's own worker: without it no job runs, so this replica is not ready.
        checks["worker"] = supervised.describe()
    elif checks["database"] == "ok":
        # Scaled mode: workers live elsewhere and come and go; how many heartbeat is shown
        # for operators but does not make an API replica unready.
        body["workers"] = {"live": await _live_worker_count(state)}
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", **body},
        status_code=200 if ready else 503,
        headers=None if ready else {"Retry-After": "5"},
    )


async def _live_worker_count(state: Any) -> int | str:
    settings = state.settings
    try:
        async with state.sessionmaker() as session:
            ids = await asyncio.wait_for(
                live_worker_ids(session, settings.worker.live_after_seconds), CHECK_TIMEOUT
            )
    except Exception as exc:
        return f"unavailable: {type(exc).__name__}"
    return len(ids)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = request.app.state
    figures = getattr(state, "database_metrics", None)
    if figures is None:
        figures = state.database_metrics = DatabaseMetrics(state.settings)
    await figures.refresh(state.sessionmaker)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
