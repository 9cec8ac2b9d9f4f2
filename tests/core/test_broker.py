"""Two registries (or test runs) on one Redis database: each broker's messages stay its own."""

from __future__ import annotations

import uuid

import pytest
import redis

from tensor_registry_server.core.broker import make_celery
from tensor_registry_server.settings import Settings
from tests.conftest import IN_CI
from tests.pipeline.conftest import REDIS_URL


def _redis() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError:
        if IN_CI:
            pytest.fail(f"Redis is required in CI and is not reachable at {REDIS_URL}")
        pytest.skip(f"Redis not reachable at {REDIS_URL}")
    return client


def test_a_key_prefix_keeps_each_brokers_queue_apart(tmp_path: object) -> None:
    client = _redis()
    first, second = (f"tr-test-{uuid.uuid4().hex[:12]}:" for _ in range(2))
    try:
        for prefix in (first, second):
            settings = Settings(
                data_dir=tmp_path,  # type: ignore[arg-type]
                broker={"url": REDIS_URL, "redis_url": REDIS_URL, "key_prefix": prefix},  # type: ignore[arg-type]
            )
            app = make_celery(settings)
            app.send_task("artifacts.tensorize", args=[prefix], queue="cpu")
            app.close()
        # Each message sits in its own broker's queue, under its prefix, and nowhere else.
        for prefix in (first, second):
            messages = client.lrange(f"{prefix}cpu", 0, -1)
            assert len(messages) == 1 and prefix.encode() in messages[0]
    finally:
        for prefix in (first, second):
            for key in client.scan_iter(match=f"{prefix}*"):
                client.delete(key)
        client.close()
