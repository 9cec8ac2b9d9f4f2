"""Ctrl-C while following a job is never lost (tensor_registry.cli.job_commands._catch_interrupts):
Python drops an exception raised by a signal handler inside a finaliser, so the follow loop
also checks a flag on every line of the event stream (keep-alives included) and between polls.
A loopback server plays the registry: a job that stays queued, keep-alive comments every 20 ms
or no event stream at all (the polling fallback)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from harness.loopback import serving
from tensor_registry.api.client import RegistryClient

JOB = {"id": "j1", "kind": "tensorize", "status": "queued", "progress": {}}


class _Registry(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stream = True

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.endswith("/events"):
            if not self.stream:
                body = b'{"title": "Not Found", "status": 404, "code": "not_found"}'
                self.send_response(404)
                self.send_header("Content-Type", "application/problem+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(f"event: job\ndata: {json.dumps(JOB)}\n\n".encode())
            try:
                for _ in range(500):  # 10 s of keep-alives at most
                    self.wfile.write(b": keepalive\n\n")
                    self.wfile.flush()
                    time.sleep(0.02)
            except OSError:
                pass
            self.close_connection = True
            return
        body = json.dumps(JOB).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def _registry(stream: bool) -> Iterator[str]:
    with serving(type("Handler", (_Registry,), {"stream": stream})) as url:
        yield url


@pytest.mark.parametrize("stream", [True, False], ids=["event-stream", "polling"])
def test_a_remembered_interrupt_ends_the_follow_at_the_next_line_or_poll(stream: bool) -> None:
    updates: list[str] = []
    interrupted = threading.Event()

    def update(job: dict[str, object]) -> None:
        updates.append(str(job["status"]))
        # As if Ctrl-C had come and its KeyboardInterrupt had been dropped in a finaliser.
        interrupted.set()

    with _registry(stream) as url, RegistryClient(url, "trg_test") as client:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            client.wait_job("j1", on_update=update, poll_seconds=0.05, stop=interrupted.is_set)
        elapsed = time.monotonic() - started
    assert updates == ["queued"]
    assert elapsed < 5, elapsed  # the next keep-alive / poll, not the job's end (never)


def test_without_an_interrupt_the_follow_goes_on() -> None:
    """The flag only ends a follow that was interrupted: with it unset the same stream keeps
    being followed; it ends only after the flag is set (here by a timer, 0.5 s in)."""
    updates: list[str] = []
    set_at: list[float] = []
    stop_after = threading.Event()

    def interrupt() -> None:
        set_at.append(time.monotonic())
        stop_after.set()

    with _registry(True) as url, RegistryClient(url, "trg_test") as client:
        timer = threading.Timer(0.5, interrupt)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                client.wait_job(
                    "j1",
                    on_update=lambda job: updates.append(str(job["status"])),
                    poll_seconds=0.05,
                    stop=stop_after.is_set,
                )
            ended_at = time.monotonic()
        finally:
            timer.cancel()
    assert updates and set(updates) == {"queued"}
    assert set_at and ended_at >= set_at[0]  # it went on until the flag was set
