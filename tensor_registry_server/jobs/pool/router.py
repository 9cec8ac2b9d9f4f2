"""Workers and what they can run. Where they run (hostname, and the id, which is
'<hostname>:<pid>') is for ``admin`` tokens: any other token sees an opaque, stable handle in
``id`` and ``hostname: null`` (issue 26 §5: hostnames are reconnaissance)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tensor_registry_server.auth import ReadToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.jobs.pool import service
from tensor_registry_server.jobs.pool.schemas import WorkerList, WorkerOut
from tensor_registry_server.rows.worker_pool import WorkerRecord

router = APIRouter(prefix="/api/v1/workers", tags=["workers"])


def to_out(worker: WorkerRecord, live: bool, *, admin: bool = True) -> WorkerOut:
    return WorkerOut(
        id=worker.id if admin else service.opaque_worker_id(worker.id),
        hostname=worker.hostname if admin else None,
        queues=list(worker.queues),
        capabilities=dict(worker.capabilities),
        started_at=worker.started_at,
        last_seen_at=worker.last_seen_at,
        live=live,
    )


@router.get("", response_model=WorkerList)
async def list_workers(
    session: SessionDep,
    principal: ReadToken,
    settings: SettingsDep,
    include_stale: Annotated[
        bool, Query(description="Also list workers that stopped heartbeating.")
    ] = False,
) -> WorkerList:
    rows = await service.list_workers(session, settings, include_stale=include_stale)
    return WorkerList(items=[to_out(w, live, admin=principal.is_admin) for w, live in rows])
