"""Workers: heartbeats with capabilities, liveness, and routing a job to a queue that a live
worker able to run it consumes (or a 409 that says what is missing)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import Conflict
from tensor_registry_server.rows.worker_pool import WorkerRecord
from tensor_registry_server.settings import Settings


async def heartbeat(
    session: AsyncSession,
    *,
    worker_id: str,
    hostname: str,
    queues: list[str],
    capabilities: dict[str, Any],
    started_at: datetime,
) -> None:
    """Upsert this worker's row (an UPDATE, then an INSERT when there was nothing to update)."""
    now = utcnow()
    updated = await session.execute(
        update(WorkerRecord)
        .where(WorkerRecord.id == worker_id)
        .values(queues=queues, capabilities=capabilities, last_seen_at=now)
    )
    if updated.rowcount == 1:  # type: ignore[attr-defined]
        return
    session.add(
        WorkerRecord(
            id=worker_id,
            hostname=hostname,
            queues=queues,
            capabilities=capabilities,
            started_at=started_at,
            last_seen_at=now,
        )
    )
    await session.flush()


async def remove_worker(session: AsyncSession, worker_id: str) -> None:
    await session.execute(delete(WorkerRecord).where(WorkerRecord.id == worker_id))


def _cutoff(live_after_seconds: float) -> datetime:
    return utcnow() - timedelta(seconds=live_after_seconds)


async def live_workers(session: AsyncSession, live_after_seconds: float) -> list[WorkerRecord]:
    stmt = (
        select(WorkerRecord)
        .where(WorkerRecord.last_seen_at >= _cutoff(live_after_seconds))
        .order_by(WorkerRecord.id)
    )
    return list((await session.execute(stmt)).scalars())


async def routable_workers(session: AsyncSession, settings: Settings) -> list[WorkerRecord]:
    """Live workers, plus the embedded worker of ``serve`` while it has not heartbeated yet
    (just started, or restarting after it died): its jobs wait in the queue for it."""
    from tensor_registry_server.jobs.pool import embedded

    workers = await live_workers(session, settings.worker.live_after_seconds)
    supervised = embedded.current()
    if supervised is not None and supervised.node_id not in {w.id for w in workers}:
        workers.append(supervised.stand_in())
    return workers


async def live_worker_ids(session: AsyncSession, live_after_seconds: float) -> set[str]:
    stmt = select(WorkerRecord.id).where(WorkerRecord.last_seen_at >= _cutoff(live_after_seconds))
    return set((await session.execute(stmt)).scalars())


async def list_workers(
    session: AsyncSession, settings: Settings, *, include_stale: bool
) -> list[tuple[WorkerRecord, bool]]:
    cutoff = _cutoff(settings.worker.live_after_seconds)
    stmt = select(WorkerRecord).order_by(WorkerRecord.id)
    if not include_stale:
        stmt = stmt.where(WorkerRecord.last_seen_at >= cutoff)
    rows = list((await session.execute(stmt)).scalars())
    return [(row, row.last_seen_at >= cutoff) for row in rows]


# ---------------------------------------------------------------------------------------------
# Routing


@dataclass(frozen=True)
class Requirement:
    kind: str  # "tensorize" | "verify"
    format: str
    tensor_parallel_size: int
    encrypted: bool
    # Bytes of source weights: what a worker must hold in memory (at most, in the target dtype).
    source_bytes: int


def _caps(worker: WorkerRecord) -> dict[str, Any]:
    return worker.capabilities or {}


def _gpu_count(worker: WorkerRecord) -> int:
    return int((_caps(worker).get("cuda") or {}).get("device_count") or 0)


def _gpu_memory(worker: WorkerRecord) -> int:
    devices = (_caps(worker).get("cuda") or {}).get("devices") or []
    return max((int(d.get("total_memory") or 0) for d in devices), default=0)


def _ram(worker: WorkerRecord) -> int:
    return int((_caps(worker).get("cpu") or {}).get("memory_total") or 0)


def _has_vllm(worker: WorkerRecord) -> bool:
    return bool((_caps(worker).get("versions") or {}).get("vllm"))


# What /metrics counts live workers by (tensor_registry_live_workers{capability=...}).
CAPABILITIES = ("any", "gpu_queue", "cpu_queue", "cuda", "vllm", "encryption")


def capabilities_of(worker: WorkerRecord) -> set[str]:
    names = {"any"}
    names.update(f"{queue}_queue" for queue in worker.queues if queue in ("gpu", "cpu"))
    if _gpu_count(worker) >= 1:
        names.add("cuda")
    if _has_vllm(worker):
        names.add("vllm")
    if _caps(worker).get("encryption"):
        names.add("encryption")
    return names


def opaque_worker_id(worker_id: str) -> str:
    """A handle that tells workers apart without naming their host ('<hostname>:<pid>'): what
    non-admin tokens and the unauthenticated /metrics see."""
    return "worker-" + hashlib.sha256(worker_id.encode()).hexdigest()[:16]


async def heartbeat_ages(session: AsyncSession, *, within_seconds: float) -> dict[str, float]:
    """Seconds since each worker's last heartbeat, by opaque id, for the workers heard from
    within ``within_seconds`` (older rows are history, not silent workers)."""
    now = utcnow()
    stmt = select(WorkerRecord.id, WorkerRecord.last_seen_at).where(
        WorkerRecord.last_seen_at >= _cutoff(within_seconds)
    )
    return {
        opaque_worker_id(worker_id): max((now - seen).total_seconds(), 0.0)
        for worker_id, seen in (await session.execute(stmt)).all()
    }


async def live_capability_counts(
    session: AsyncSession, live_after_seconds: float
) -> dict[str, int]:
    counts = dict.fromkeys(CAPABILITIES, 0)
    for worker in await live_workers(session, live_after_seconds):
        for name in capabilities_of(worker):
            counts[name] += 1
    return counts


def route(workers: list[WorkerRecord], req: Requirement, settings: Settings) -> str:
    """The queue to send the job to; 409 ``no_capable_worker`` naming what is missing."""
    missing: list[str] = []
    pool = workers
    if not pool:
        missing.append(
            "a live worker (none has sent a heartbeat in the last "
            f"{settings.worker.live_after_seconds:.0f}s: start one with `tensor-registry worker`)"
        )
    if req.encrypted:
        pool = [w for w in pool if _caps(w).get("encryption")]
        if workers and not pool:
            missing.append("a live worker with tensorizer encryption (libsodium installed)")
    if pool and req.kind == "verify":
        for queue in ("cpu", "gpu"):
            if any(queue in w.queues for w in pool):
                return queue
    elif pool and req.format == "vllm":
        with_vllm = [w for w in pool if "gpu" in w.queues and _has_vllm(w)]
        enough = [w for w in with_vllm if _gpu_count(w) >= req.tensor_parallel_size]
        if enough:
            return "gpu"
        if not with_vllm:
            missing.append("a live worker on the gpu queue with vLLM installed (format 'vllm')")
        else:
            most = max(_gpu_count(w) for w in with_vllm)
            missing.append(
                f"a vLLM worker with at least {req.tensor_parallel_size} GPUs "
                f"(tensor_parallel_size {req.tensor_parallel_size}; the largest has {most})"
            )
    elif pool:
        gpu = [
            w
            for w in pool
            if "gpu" in w.queues and _gpu_count(w) >= 1 and _gpu_memory(w) >= req.source_bytes
        ]
        if gpu:
            return "gpu"
        limit = settings.worker.cpu_tensorize_max_bytes
        if req.source_bytes <= limit:
            cpu = [w for w in pool if "cpu" in w.queues and _ram(w) >= req.source_bytes]
            if cpu:
                return "cpu"
            missing.append(
                f"a live worker on the cpu or gpu queue with at least {req.source_bytes} bytes "
                "of memory"
            )
        else:
            missing.append(
                f"a live GPU worker with at least {req.source_bytes} bytes of GPU memory (the "
                f"model has {req.source_bytes} bytes of weights, above the {limit} allowed on "
                "CPU workers)"
            )
    if not missing:
        missing.append("a live worker consuming the cpu or gpu queue")
    raise Conflict(
        "No live worker can run this job: it needs " + "; ".join(missing) + ".",
        code="no_capable_worker",
        title="No capable worker",
        missing=missing,
        live_workers=len(workers),
    )
