"""The embedded broker never hands a consumer half a message
(tensor_registry_server/core/fs_transport.py).

kombu's own file-system transport opens a message's final name and then writes into it; a worker
polling in between read half a JSON document and stopped ("Unrecoverable error"). These tests
stop the writer half-way and look at the folder as a consumer does.
"""

from __future__ import annotations

import os
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from tensor_registry_server.core.broker import make_celery
from tensor_registry_server.core.fs_transport import TRANSPORT, Channel
from tensor_registry_server.settings import Settings


def _channel(settings: Settings) -> Any:
    app = make_celery(settings)
    conn = Connection(
        app.conf.broker_url,
        transport=app.conf.broker_transport,
        transport_options=app.conf.broker_transport_options,
    )
    return conn, conn.channel()


def test_the_embedded_broker_uses_the_atomic_transport(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.embedded_broker
    assert make_celery(settings).conf.broker_transport == TRANSPORT
    conn, channel = _channel(settings)
    try:
        assert isinstance(channel, Channel)
    finally:
        conn.release()


def test_a_message_being_written_is_invisible_then_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path)
    conn, producer = _channel(settings)
    _, consumer = _channel(settings)
    payload = {"body": "x" * 100_000, "headers": {"task": "artifacts.tensorize"}}
    seen: list[Any] = []

    def halfway(f: Any, data: bytes) -> None:
        f.write(data[: len(data) // 2])
        f.flush()
        # What a polling worker sees now: the half-written file is there, under a name no
        # consumer takes, and no message is.
        names = os.listdir(settings.broker_dir / "out")
        seen.append(names)
        with pytest.raises(Empty):
            consumer._get("cpu")
        f.write(data[len(data) // 2 :])

    try:
        monkeypatch.setattr(Channel, "_write_message", staticmethod(halfway))
        producer._put("cpu", payload)
        assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith(".")
        assert consumer._get("cpu") == payload
        with pytest.raises(Empty):
            consumer._get("cpu")
        # Consumed: gone from the queue folder and from the processed folder, nothing in /tmp.
        assert os.listdir(settings.broker_dir / "out") == []
        assert os.listdir(settings.broker_dir / "processed") == []
    finally:
        conn.release()


def test_messages_of_other_queues_stay(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    conn, channel = _channel(settings)
    try:
        channel._put("gpu", {"n": 1})
        channel._put("cpu", {"n": 2})
        channel._put("cpu", {"n": 3})
        assert channel._get("cpu") == {"n": 2}
        assert channel._get("cpu") == {"n": 3}
        with pytest.raises(Empty):
            channel._get("cpu")
        assert channel._get("gpu") == {"n": 1}
    finally:
        conn.release()


def test_an_idle_wait_ends_after_one_polling_interval_not_celerys_two_seconds(
    tmp_path: Path,
) -> None:
    """Celery's loop asks for 2 s waits and looks for a pending shutdown between them; the
    embedded broker's wait is one polling interval, so a stopped worker leaves at once."""
    import socket
    import time

    from tensor_registry_server.core.broker import FILESYSTEM_POLL_SECONDS

    settings = Settings(data_dir=tmp_path)
    conn, channel = _channel(settings)
    try:
        channel.queue_declare("cpu")
        channel.basic_consume("cpu", no_ack=True, callback=lambda *a: None, consumer_tag="t")
        started = time.monotonic()
        with pytest.raises(socket.timeout):
            conn.drain_events(timeout=2.0)
        waited = time.monotonic() - started
    finally:
        conn.release()
    assert FILESYSTEM_POLL_SECONDS <= waited < 1.5, waited
