"""GET /api/v1/events against real `tensor-registry serve` processes: a client that reconnects
with Last-Event-ID after a server restart misses nothing and sees nothing twice; two replicas
sharing PostgreSQL and Redis fan events out to each other's streams through Redis pub/sub
(their slow fallback poll is set far beyond the test's deadline, so only the push can pass)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.serve_process import ServeProcess, free_port
from harness.waiting import poll
from tests.conftest import ADMIN_TOKEN, IN_CI, migrated_database
from tests.factories import create_model, ready_version

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


class Follower:
    """Reads /api/v1/events in a thread; each event's payload lands on ``events``."""

    def __init__(self, base_url: str, last_event_id: str | None = None) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._response: httpx.Response | None = None
        self._socket: socket.socket | None = None
        headers = dict(HEADERS)
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self._thread = threading.Thread(target=self._run, args=(base_url, headers), daemon=True)
        self._thread.start()
        assert self.connected.wait(30), "the event stream did not open"

    def _run(self, base_url: str, headers: dict[str, str]) -> None:
        with (
            httpx.Client(base_url=base_url, timeout=httpx.Timeout(5, read=None)) as http,
            http.stream("GET", "/api/v1/events", headers=headers) as response,
        ):
            self._response = response
            stream = response.extensions.get("network_stream")
            self._socket = stream.get_extra_info("socket") if stream is not None else None
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            self.connected.set()
            fields: dict[str, str] = {}
            with contextlib.suppress(httpx.HTTPError):  # close() hangs up under the reader
                for line in response.iter_lines():
                    if self._stop.is_set():
                        return
                    if not line:
                        if "data" in fields:
                            self.events.put(json.loads(fields["data"]))
                        fields = {}
                    elif ": " in line and not line.startswith(":"):
                        key, value = line.split(": ", 1)
                        fields[key] = value

    def next(self, timeout: float = 30) -> dict[str, Any]:
        return self.events.get(timeout=timeout)

    def wait_ended(self, timeout: float = 30) -> None:
        """Until the server has ended the stream (the reader saw its end)."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the server did not end the event stream"

    def close(self) -> None:
        """Hang up (the server sees the disconnect and ends the stream). Shutting the socket
        down wakes the reading thread at once: closing the response from this thread does not
        end a read blocked in another, which waited out the join (10 s) and then the server's
        graceful shutdown of the stream still open (5 s)."""
        self._stop.set()
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
        if self._response is not None:
            # The reading thread may be closing it at the same moment.
            with contextlib.suppress(Exception):
                self._response.close()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the event stream reader did not end on hang-up"


def _api(serve: ServeProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=serve.url, headers=HEADERS, timeout=30)


async def _publish(serve: ServeProcess, name: str, versions: int) -> str:
    async with _api(serve) as api:
        model = await create_model(api, name=name)
        for _ in range(versions):
            await ready_version(api, model["id"])
        return str(model["id"])


async def _move(serve: ServeProcess, model_id: str, version: int) -> None:
    async with _api(serve) as api:
        r = await api.put(f"/api/v1/models/{model_id}/aliases/prod", json={"version": version})
        assert r.status_code in (200, 201), r.text


def test_resume_with_last_event_id_across_a_restart(tmp_path: Path) -> None:
    serve = ServeProcess(
        tmp_path / "data", free_port(), env={"TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN}
    ).start()
    try:
        model_id = asyncio.run(_publish(serve, "acme/resume", 3))
        follower = Follower(serve.url, last_event_id="0")
        seen = [follower.next(), follower.next(), follower.next()]
        assert [e["type"] for e in seen] == ["version.ready"] * 3
        asyncio.run(_move(serve, model_id, 1))
        moved = follower.next()
        assert moved["type"] == "alias.moved" and moved["data"]["to_version"] == 1
        # The registry stops while the client follows: its stream ends at once (the client
        # resumes from its Last-Event-ID), it does not hold the shutdown for the grace period.
        serve.stop()
        follower.wait_ended()
        poll(
            lambda: any("Finished server process" in line for line in serve.lines),
            what="serve's last log line",
            timeout=30,
        )
        assert not any("graceful shutdown exceeded" in line for line in serve.lines)
        assert not any("Exception in ASGI application" in line for line in serve.lines)
        follower.close()

        # The registry comes back; changes happen while the client is away.
        serve.start()
        asyncio.run(_move(serve, model_id, 2))
        asyncio.run(_move(serve, model_id, 3))
        resumed = Follower(serve.url, last_event_id=moved["id"])
        after = [resumed.next(), resumed.next()]
        assert [(e["type"], e["data"]["to_version"]) for e in after] == [
            ("alias.moved", 2),
            ("alias.moved", 3),
        ]
        assert int(after[0]["id"]) > int(moved["id"])
        # Then live, and nothing replayed twice.
        asyncio.run(_move(serve, model_id, 1))
        live = resumed.next()
        assert live["data"]["to_version"] == 1 and int(live["id"]) > int(after[1]["id"])
        assert resumed.events.empty()
        resumed.close()
    finally:
        serve.stop()


def _redis_available() -> bool:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
        return True
    except Exception:
        return False


@pytest.fixture
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with migrated_database("postgresql", tmp_path_factory, label="events") as url:
        yield url


def test_two_replicas_fan_out_through_redis(postgres_url: str, tmp_path: Path) -> None:
    if not _redis_available():
        # Every backend is required in CI (as tests/pipeline/conftest.py requires Redis).
        if IN_CI:
            pytest.fail(f"Redis is required in CI and is not reachable at {REDIS_URL}")
        pytest.skip("Redis not reachable")
    prefix = f"trg-test-{uuid.uuid4().hex[:8]}:"
    env = {
        "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        "TENSOR_REGISTRY_DATABASE__URL": postgres_url,
        "TENSOR_REGISTRY_BROKER__REDIS_URL": REDIS_URL,
        "TENSOR_REGISTRY_BROKER__KEY_PREFIX": prefix,
        # Far beyond the waits below: only the Redis push can carry an event in time.
        "TENSOR_REGISTRY_EVENTS__POLL_SECONDS": "600",
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": "k" * 32,
        "TENSOR_REGISTRY_SECURITY__MASTER_KEY": "m" * 32,
    }
    a = ServeProcess(tmp_path / "a", free_port(), env=env).start()
    b = ServeProcess(tmp_path / "b", free_port(), env=env).start()
    try:
        on_b = Follower(b.url)
        on_a = Follower(a.url)
        model_id = asyncio.run(_publish(a, "acme/replicas", 2))  # written through A
        assert [on_b.next()["type"], on_b.next()["type"]] == ["version.ready"] * 2
        asyncio.run(_move(b, model_id, 1))  # written through B
        for follower in (on_a, on_b):
            events = [e for e in (follower.next() for _ in range(3 if follower is on_a else 1))]
            assert events[-1]["type"] == "alias.moved", events
        # The channel carries the registry's key prefix.
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        channels = {c.decode() for c in client.pubsub_channels(f"{prefix}*")}
        assert channels == {f"{prefix}tensor-registry:events"}
        on_a.close()
        on_b.close()
    finally:
        a.stop()
        b.stop()
