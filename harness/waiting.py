"""Waiting for a state in tests: short polls up to a deadline, never a fixed sleep that races.

    job = await wait_job(api, job_id)                 # httpx.AsyncClient; until a final status
    job = wait_job_sync(http, job_id, timeout=300)    # httpx.Client
    await wait_live_worker(api) / wait_live_worker_sync(http)
    value = poll(lambda: ..., what="the log line")    # any condition: its first truthy value
    value = await poll_async(...)

Clients may be based at the server's root or at its ``/api/v1`` (the UI suite's ``server.api``):
routes are joined accordingly. ``until`` is a set of statuses or a predicate on the job (which
may assert on the states it passes through). On the deadline the test fails, saying what it
waited for, the last value seen and ``detail()`` (a log tail, say).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import httpx
import pytest

FINAL = frozenset({"succeeded", "failed", "cancelled"})
INTERVAL = 0.1

T = TypeVar("T")
Job = dict[str, Any]
Until = Collection[str] | Callable[[Job], bool]


def _fail(what: str, timeout: float, last: Any, detail: Callable[[], str] | None) -> None:
    extra = f"\n{detail()}" if detail is not None else ""
    pytest.fail(f"waited {timeout} s for {what}; last seen: {last!r}{extra}")


def poll(
    check: Callable[[], T],
    *,
    what: str,
    ready: Callable[[T], bool] = bool,
    timeout: float = 60,
    interval: float = INTERVAL,
    detail: Callable[[], str] | None = None,
) -> T:
    """The first value of ``check()`` that is ``ready`` (truthy by default), asked every
    ``interval`` s until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if ready(value):
            return value
        if time.monotonic() >= deadline:
            _fail(what, timeout, value, detail)
        time.sleep(interval)


async def poll_async(
    check: Callable[[], Awaitable[T]],
    *,
    what: str,
    ready: Callable[[T], bool] = bool,
    timeout: float = 60,
    interval: float = INTERVAL,
    detail: Callable[[], str] | None = None,
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if ready(value):
            return value
        if time.monotonic() >= deadline:
            _fail(what, timeout, value, detail)
        await asyncio.sleep(interval)


def _route(client: httpx.Client | httpx.AsyncClient, path: str) -> str:
    api = str(client.base_url.path).rstrip("/").endswith("/api/v1")
    return path if api else f"/api/v1{path}"


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def _job_wait(job_id: str, until: Until) -> tuple[Callable[[Job], bool], str]:
    if callable(until):
        return until, f"job {job_id} to reach the awaited state"
    statuses = frozenset(until)
    return (lambda job: job["status"] in statuses), f"job {job_id} to be {'/'.join(sorted(until))}"


async def wait_job(
    client: httpx.AsyncClient,
    job_id: str,
    *,
    timeout: float = 120,
    until: Until = FINAL,
    interval: float = INTERVAL,
    detail: Callable[[], str] | None = None,
) -> Job:
    """GET /api/v1/jobs/{id} until ``until`` holds; returns that job."""
    route = _route(client, f"/jobs/{job_id}")
    ready, what = _job_wait(job_id, until)

    async def check() -> Job:
        return dict(_ok(await client.get(route)))

    return await poll_async(
        check, what=what, ready=ready, timeout=timeout, interval=interval, detail=detail
    )


def wait_job_sync(
    client: httpx.Client,
    job_id: str,
    *,
    timeout: float = 120,
    until: Until = FINAL,
    interval: float = INTERVAL,
    detail: Callable[[], str] | None = None,
) -> Job:
    route = _route(client, f"/jobs/{job_id}")
    ready, what = _job_wait(job_id, until)
    return poll(
        lambda: dict(_ok(client.get(route))),
        what=what,
        ready=ready,
        timeout=timeout,
        interval=interval,
        detail=detail,
    )


async def wait_live_worker(
    client: httpx.AsyncClient, *, timeout: float = 120, detail: Callable[[], str] | None = None
) -> list[dict[str, Any]]:
    """GET /api/v1/workers until a worker's heartbeat is in; returns the live workers."""
    route = _route(client, "/workers")

    async def check() -> list[dict[str, Any]]:
        return list(_ok(await client.get(route))["items"])

    return await poll_async(check, what="a live worker", timeout=timeout, detail=detail)


def wait_live_worker_sync(
    client: httpx.Client, *, timeout: float = 120, detail: Callable[[], str] | None = None
) -> list[dict[str, Any]]:
    route = _route(client, "/workers")
    return poll(
        lambda: list(_ok(client.get(route))["items"]),
        what="a live worker",
        timeout=timeout,
        detail=detail,
    )
