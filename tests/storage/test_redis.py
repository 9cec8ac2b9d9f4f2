"""Redis backend against the running Redis, in tensorizer's own redis:// chunk layout."""

from __future__ import annotations

import asyncio
import io
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlparse, urlunparse

import pytest
from tensorizer import TensorDeserializer
from tensorizer.stream_io import open_stream

from tensor_registry_server.settings import RedisStorageSettings
from tensor_registry_server.storage.base import ChecksumMismatch, ObjectNotFound, ObjectTooLarge
from tensor_registry_server.storage.redis_store import RedisStorage
from tests.storage.helpers import (
    assert_same_tensors,
    chunks_of,
    failing_after,
    model_of,
    payload,
    sha256,
    state_of,
)
from tests.storage.test_s3 import serialize_into

MiB = 1024 * 1024


async def redis_names(storage: RedisStorage) -> list[str]:
    client = storage.client()
    return sorted(
        [n.decode() async for n in client.scan_iter(match=f"{storage.prefix}*", count=1000)]
    )


async def test_objects_are_chunk_strings_that_tile_the_file(redis_storage: RedisStorage) -> None:
    data = payload(2 * MiB + 100)
    stored = await redis_storage.put_stream("versions/v/u/model.safetensors", chunks_of(data))
    assert (stored.size, stored.sha256) == (len(data), sha256(data))
    base = f"{redis_storage.prefix}versions/v/u/model.safetensors"
    assert await redis_names(redis_storage) == sorted(
        [base, f"{base}:0", f"{base}:{MiB}", f"{base}:{2 * MiB}"]
    )
    assert await redis_storage.read_bytes("versions/v/u/model.safetensors") == data
    assert (
        await redis_storage.read_bytes(
            "versions/v/u/model.safetensors", offset=MiB - 10, length=MiB + 50
        )
        == data[MiB - 10 : 2 * MiB + 40]
    )
    info = await redis_storage.stat("versions/v/u/model.safetensors")
    assert info.size == len(data) and info.etag == sha256(data)
    assert [i.key async for i in redis_storage.list("versions/")] == [
        "versions/v/u/model.safetensors"
    ]


async def test_failed_uploads_leave_no_keys(redis_storage: RedisStorage) -> None:
    data = payload(3 * MiB, seed=1)
    with pytest.raises(ChecksumMismatch):
        await redis_storage.put_stream("versions/v/u/a", chunks_of(data), expected_sha256="0" * 64)
    with pytest.raises(ObjectTooLarge):
        await redis_storage.put_stream("versions/v/u/b", chunks_of(data), max_size=2 * MiB)
    with pytest.raises(ConnectionResetError):
        await redis_storage.put_stream("versions/v/u/c", failing_after(data, 2 * MiB))
    assert await redis_names(redis_storage) == []


async def test_replacing_deleting_and_temp_purge(redis_storage: RedisStorage) -> None:
    await redis_storage.put_stream("artifacts/a/f", chunks_of(payload(3 * MiB)))
    await redis_storage.put_stream("artifacts/a/f", chunks_of(b"short"))
    assert await redis_storage.read_bytes("artifacts/a/f") == b"short"
    base = f"{redis_storage.prefix}artifacts/a/f"
    assert await redis_names(redis_storage) == [base, f"{base}:0"]
    await redis_storage.put_stream("artifacts/a/g", chunks_of(b"g"))
    await redis_storage.put_stream("artifacts/b/h", chunks_of(b"h"))
    await redis_storage.delete("artifacts/b/h")
    with pytest.raises(ObjectNotFound):
        await redis_storage.stat("artifacts/b/h")
    assert await redis_storage.delete_prefix("artifacts/a/") == 2
    assert await redis_names(redis_storage) == []
    # A crashed writer's temp chunks: purged once older than the grace period.
    stale = f"{redis_storage.prefix}tmp/redis/1000-{uuid.uuid4().hex}:0"
    await redis_storage.client().set(stale, b"x")
    assert await redis_storage.purge_temp(datetime.now(UTC) - timedelta(hours=1)) == 1
    assert await redis_names(redis_storage) == []


async def test_sink_and_source_round_trip_a_tensorized_module(redis_storage: RedisStorage) -> None:
    module = model_of(6)
    expected = state_of(module)

    def run() -> list[tuple[str, Any]]:
        sink = redis_storage.open_sink("artifacts/t/model.tensors")
        serialize_into(sink, module)
        stored = sink.commit()
        with redis_storage.open_source("artifacts/t/model.tensors") as source:
            body = source.read()
            assert stored.size == len(body) and stored.sha256 == sha256(body)
            source.seek(0)
            with TensorDeserializer(source, device="cpu", verify_hash=True) as d:
                return [(name, tensor.clone()) for name, tensor in d.items()]

    assert_same_tensors(await asyncio.to_thread(run), expected)
    assert not [n for n in await redis_names(redis_storage) if "/tmp/" in n]


async def test_sink_abort_removes_its_chunks(redis_storage: RedisStorage) -> None:
    def run() -> None:
        sink = redis_storage.open_sink("artifacts/t/x")
        sink.seek(3 * MiB)
        sink.write(b"tail")
        sink.abort()

    await asyncio.to_thread(run)
    assert await redis_names(redis_storage) == []


def _db0(url: str) -> str:
    parsed = urlparse(url)
    return urlunparse(parsed._replace(path="/0"))


async def test_tensorizer_reads_redis_uri_natively(redis_url: str) -> None:
    """tensorizer's own RedisStreamFile (db 0 only) reads what the backend wrote."""
    prefix = f"tr-test-{uuid.uuid4().hex[:12]}/"
    storage = RedisStorage(RedisStorageSettings(url=_db0(redis_url), prefix=prefix, chunk_mb=1))
    module = model_of(5, seed=3)
    expected = state_of(module)
    try:
        await asyncio.to_thread(_write_module, storage, "artifacts/r/model.tensors", module)
        uri = storage.tensorizer_uri("artifacts/r/model.tensors")
        assert uri == f"redis://127.0.0.1:6379/{prefix}artifacts/r/model.tensors"

        def load() -> tuple[bytes, list[tuple[str, Any]]]:
            with open_stream(uri, "rb") as stream:
                raw = stream.read()
            with TensorDeserializer(uri, device="cpu", num_readers=4, verify_hash=True) as d:
                return raw, [(name, tensor.clone()) for name, tensor in d.items()]

        raw, tensors = await asyncio.to_thread(load)
        assert raw == await storage.read_bytes("artifacts/r/model.tensors")
        assert_same_tensors(tensors, expected)
    finally:
        await storage.delete_prefix("artifacts/")
        await storage.close()
    assert (
        RedisStorage(RedisStorageSettings(url="redis://127.0.0.1:6379/3")).tensorizer_uri("a/b/c")
        is None
    )
    assert (
        RedisStorage(RedisStorageSettings(url="redis://:pw@127.0.0.1:6379/0")).tensorizer_uri(
            "a/b/c"
        )
        is None
    )


def _write_module(storage: RedisStorage, key: str, module: Any) -> None:
    sink = storage.open_sink(key)
    serialize_into(sink, module)
    sink.commit()


async def test_open_source_seeks(redis_storage: RedisStorage) -> None:
    data = payload(2 * MiB + 3, seed=5)
    await redis_storage.put_stream("versions/v/u/w", chunks_of(data))

    def run() -> None:
        with redis_storage.open_source("versions/v/u/w") as fh:
            fh.seek(MiB - 2)
            assert fh.read(5) == data[MiB - 2 : MiB + 3]
            fh.seek(-3, io.SEEK_END)
            assert fh.read() == data[-3:]

    await asyncio.to_thread(run)
