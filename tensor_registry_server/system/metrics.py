"""The job and worker figures of /metrics, read from the database when Prometheus scrapes.

Why at scrape time from the rows: jobs change state in worker processes (often on other
hosts), and every API replica reads the same rows, so any replica answers the same numbers and
no worker needs a port of its own. The reads are indexed (jobs.status, jobs.finished_at,
workers.last_seen_at) and bounded.

Finished jobs are counted (``tensor_registry_jobs_finished_total``) and observed into the
duration and throughput histograms once each, by the first scrape of this process that sees
them: a watermark on ``finished_at``, re-read with an overlap (a job committed late, or a
worker clock behind) and de-duplicated by job id. Counting starts when the process first
serves /metrics, like any counter.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tensor_registry_server.core import metrics
from tensor_registry_server.core.db import session_scope, utcnow
from tensor_registry_server.jobs.pool.service import heartbeat_ages, live_capability_counts
from tensor_registry_server.jobs.service import (
    active_job_counts,
    jobs_finished_since,
    running_job_ages,
)
from tensor_registry_server.limits.service import Limits, Usage, all_usage
from tensor_registry_server.nodes.service import fleet_figures
from tensor_registry_server.rows.jobs import JobKind, JobStatus
from tensor_registry_server.settings import Settings

log = logging.getLogger("tensor_registry.metrics")

KINDS = (JobKind.TENSORIZE, JobKind.IMPORT, JobKind.VERIFY, JobKind.CONVERT)
ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)
OVERLAP = timedelta(minutes=10)
# Workers whose last heartbeat is older than this drop out of the heartbeat-age series.
HEARTBEAT_HISTORY_SECONDS = 24 * 3600.0
TIMEOUT_SECONDS = 5.0

for _kind in KINDS:
    metrics.JOB_THROUGHPUT.labels(_kind)
    metrics.OLDEST_RUNNING.labels(_kind)
    metrics.STALEST_PROGRESS.labels(_kind)
    for _state in JobStatus.FINAL:
        metrics.JOB_DURATION.labels(_kind, _state)
        metrics.JOBS_FINISHED.labels(_kind, _state)


class DatabaseMetrics:
    """One per app: the finished-jobs watermark and the ids already observed."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._started = utcnow()
        self._watermark = self._started
        self._seen: dict[uuid.UUID, datetime] = {}
        # Two scrapes at once must not observe the same finished job twice.
        self._lock = asyncio.Lock()

    async def refresh(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        async with self._lock:
            try:
                await asyncio.wait_for(self._refresh(sessionmaker), TIMEOUT_SECONDS)
            except Exception as exc:
                # /metrics still answers (HTTP and process figures); the gauge says why the
                # job figures did not move.
                log.warning("metrics: database figures unavailable: %s", type(exc).__name__)
                metrics.DATABASE_UP.set(0)
            else:
                metrics.DATABASE_UP.set(1)

    async def _refresh(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        since = max(self._started, self._watermark - OVERLAP)
        async with session_scope(sessionmaker) as session:
            active = await active_job_counts(session)
            workers = await live_capability_counts(session, self.settings.worker.live_after_seconds)
            finished = await jobs_finished_since(session, since)
            running = await running_job_ages(session)
            heartbeats = await heartbeat_ages(session, within_seconds=HEARTBEAT_HISTORY_SECONDS)
            nodes, per_alias = await fleet_figures(
                session, stale_after_seconds=self.settings.nodes.stale_after_seconds
            )
            namespaces = await all_usage(session, self.settings)
        now = utcnow()
        self._set_fleet(nodes, per_alias)
        _set_namespaces(namespaces, named=self.settings.metrics.model_labels)

        oldest_running = dict.fromkeys(KINDS, 0.0)
        stalest = dict.fromkeys(KINDS, 0.0)
        for kind, started, changed in running:
            if started is not None:
                oldest_running[kind] = max((now - started).total_seconds(), 0.0)
            if changed is not None:
                stalest[kind] = max((now - changed).total_seconds(), 0.0)
        for kind in oldest_running:
            metrics.OLDEST_RUNNING.labels(kind).set(round(oldest_running[kind], 3))
            metrics.STALEST_PROGRESS.labels(kind).set(round(stalest[kind], 3))
        metrics.WORKER_HEARTBEAT_AGE.clear()
        for worker, age in heartbeats.items():
            metrics.WORKER_HEARTBEAT_AGE.labels(worker).set(round(age, 3))

        jobs = {(kind, state): 0 for kind in KINDS for state in ACTIVE}
        depth = dict.fromkeys(self.settings.worker.queues, 0)
        oldest: dict[str, float] = dict.fromkeys(self.settings.worker.queues, 0.0)
        for kind, state, queue, count, first_created in active:
            jobs[(kind, state)] = jobs.get((kind, state), 0) + count
            if state == JobStatus.QUEUED:
                depth[queue] = depth.get(queue, 0) + count
                if first_created is not None:
                    age = max((now - first_created).total_seconds(), 0.0)
                    oldest[queue] = max(oldest.get(queue, 0.0), age)
        for (kind, state), count in jobs.items():
            metrics.JOBS.labels(kind, state).set(count)
        for queue, count in depth.items():
            metrics.QUEUE_DEPTH.labels(queue).set(count)
            metrics.OLDEST_QUEUED.labels(queue).set(round(oldest[queue], 3))
        for capability, count in workers.items():
            metrics.LIVE_WORKERS.labels(capability).set(count)

        for job in finished:
            if job.id in self._seen:
                continue
            self._seen[job.id] = job.finished_at
            self._watermark = max(self._watermark, job.finished_at)
            metrics.JOBS_FINISHED.labels(job.kind, job.status).inc()
            if job.seconds is not None:
                metrics.JOB_DURATION.labels(job.kind, job.status).observe(job.seconds)
            rate = job.bytes_per_second
            if job.status == JobStatus.SUCCEEDED and rate is not None:
                metrics.JOB_THROUGHPUT.labels(job.kind).observe(rate)
        floor = self._watermark - OVERLAP
        self._seen = {k: v for k, v in self._seen.items() if v >= floor}

    def _set_fleet(
        self, nodes: dict[str, int], per_alias: dict[tuple[str, str], tuple[int, int]]
    ) -> None:
        for state, count in nodes.items():
            metrics.NODES.labels(state).set(count)
        named = self.settings.metrics.model_labels
        sums: dict[tuple[str, str], list[int]] = {}
        for (model, alias), (watching, warm) in per_alias.items():
            total = sums.setdefault(metrics.alias_labels(model, alias, named=named), [0, 0])
            total[0] += watching
            total[1] += warm
        # Series of aliases nobody watches any more go, rather than stay at their last value;
        # unnamed, the one ("all", "all") series stays, at 0 when no node watches an alias.
        metrics.NODES_WATCHING.clear()
        metrics.NODES_WARM.clear()
        if not named:
            sums.setdefault((metrics.ALL_MODELS, metrics.ALL_MODELS), [0, 0])
        for labels, (watching, warm) in sums.items():
            metrics.NODES_WATCHING.labels(*labels).set(watching)
            metrics.NODES_WARM.labels(*labels).set(warm)


NEAR = 0.9


def _near(limits: Limits, usage: Usage) -> bool:
    return any(
        limit is not None and used >= NEAR * limit
        for used, limit in (
            (usage.storage_bytes, limits.storage_bytes),
            (usage.active_jobs, limits.concurrent_jobs),
        )
    )


def _set_namespaces(found: dict[str, tuple[Limits, Usage]], *, named: bool) -> None:
    gauges = (
        metrics.NAMESPACE_STORAGE,
        metrics.NAMESPACE_STORAGE_LIMIT,
        metrics.NAMESPACE_UPLOAD_LIMIT,
        metrics.NAMESPACE_JOBS,
        metrics.NAMESPACE_JOBS_LIMIT,
    )
    for gauge in gauges:
        gauge.clear()  # a namespace gone, or a limit lifted, leaves no stale series
    metrics.NAMESPACES_NEAR_LIMIT.set(sum(_near(*pair) for pair in found.values()))
    if not named:
        total = [usage for _, usage in found.values()]
        metrics.NAMESPACE_STORAGE.labels(metrics.ALL_MODELS).set(
            sum(u.storage_bytes for u in total)
        )
        metrics.NAMESPACE_JOBS.labels(metrics.ALL_MODELS).set(sum(u.active_jobs for u in total))
        # Unnamed, the limits add up as an operator plans capacity: the storage and job slots
        # promised in all, and the largest upload any namespace may make.
        for gauge, values, combine in (
            (
                metrics.NAMESPACE_STORAGE_LIMIT,
                [lim.storage_bytes for lim, _ in found.values()],
                sum,
            ),
            (metrics.NAMESPACE_UPLOAD_LIMIT, [lim.upload_bytes for lim, _ in found.values()], max),
            (metrics.NAMESPACE_JOBS_LIMIT, [lim.concurrent_jobs for lim, _ in found.values()], sum),
        ):
            set_values = [v for v in values if v is not None]
            if set_values:
                gauge.labels(metrics.ALL_MODELS).set(combine(set_values))
        return
    for ns, (limits, usage) in found.items():
        metrics.NAMESPACE_STORAGE.labels(ns).set(usage.storage_bytes)
        metrics.NAMESPACE_JOBS.labels(ns).set(usage.active_jobs)
        for gauge, value in (
            (metrics.NAMESPACE_STORAGE_LIMIT, limits.storage_bytes),
            (metrics.NAMESPACE_UPLOAD_LIMIT, limits.upload_bytes),
            (metrics.NAMESPACE_JOBS_LIMIT, limits.concurrent_jobs),
        ):
            if value is not None:
                gauge.labels(ns).set(value)
