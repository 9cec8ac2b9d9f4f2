"""S3 backend against a real S3 server over HTTP on loopback (moto_server, not a mock)."""

from __future__ import annotations

import asyncio
import io
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from tensorizer import TensorDeserializer, TensorSerializer

from tensor_registry_server.storage.base import (
    ChecksumMismatch,
    ObjectNotFound,
    ObjectTooLarge,
    Sink,
)
from tensor_registry_server.storage.s3 import S3Storage
from tensor_registry_server.storage.s3_sync import S3Sink
from tests.storage.conftest import S3_KEY_ID, S3_SECRET
from tests.storage.helpers import (
    assert_same_tensors,
    chunks_of,
    failing_after,
    model_of,
    payload,
    sha256,
    state_of,
)

MiB = 1024 * 1024


def raw_client(storage: S3Storage) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=storage.settings.endpoint_url,
        aws_access_key_id=S3_KEY_ID,
        aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
    )


def bucket_keys(storage: S3Storage) -> list[str]:
    listing = raw_client(storage).list_objects_v2(Bucket=storage.bucket)
    return sorted(item["Key"] for item in listing.get("Contents", []))


def open_uploads(storage: S3Storage) -> list[str]:
    listing = raw_client(storage).list_multipart_uploads(Bucket=storage.bucket)
    return [u["Key"] for u in listing.get("Uploads", [])]


async def test_small_object_round_trip_under_the_prefix(s3_storage: S3Storage) -> None:
    data = payload(300_000)
    stored = await s3_storage.put_stream("versions/v1/u1/config.json", chunks_of(data))
    assert (stored.size, stored.sha256) == (len(data), sha256(data))
    assert await asyncio.to_thread(bucket_keys, s3_storage) == [
        "registry/versions/v1/u1/config.json"
    ]
    assert await s3_storage.read_bytes("versions/v1/u1/config.json") == data
    assert (
        await s3_storage.read_bytes("versions/v1/u1/config.json", offset=1000, length=77)
        == data[1000:1077]
    )
    info = await s3_storage.stat("versions/v1/u1/config.json")
    assert info.size == len(data) and info.modified is not None
    listed = [i.key async for i in s3_storage.list("versions/")]
    assert listed == ["versions/v1/u1/config.json"]


async def test_large_upload_is_multipart_with_bounded_parts(s3_storage: S3Storage) -> None:
    data = payload(13 * MiB + 12345, seed=1)
    stored = await s3_storage.put_stream(
        "versions/v1/u1/model.safetensors", chunks_of(data, 256 * 1024)
    )
    assert stored.sha256 == sha256(data)
    head = await asyncio.to_thread(
        raw_client(s3_storage).head_object,
        Bucket=s3_storage.bucket,
        Key="registry/versions/v1/u1/model.safetensors",
    )
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-3")  # three 5 MiB-ish parts
    assert await s3_storage.read_bytes("versions/v1/u1/model.safetensors") == data


@pytest.mark.parametrize("size", [100_000, 12 * MiB])
async def test_checksum_mismatch_publishes_nothing_and_leaks_no_upload(
    s3_storage: S3Storage, size: int
) -> None:
    data = payload(size, seed=2)
    with pytest.raises(ChecksumMismatch):
        await s3_storage.put_stream("versions/v/u/f.bin", chunks_of(data), expected_sha256="0" * 64)
    assert await asyncio.to_thread(bucket_keys, s3_storage) == []
    assert await asyncio.to_thread(open_uploads, s3_storage) == []


async def test_too_large_and_interrupted_uploads_leave_nothing(s3_storage: S3Storage) -> None:
    data = payload(12 * MiB, seed=3)
    with pytest.raises(ObjectTooLarge):
        await s3_storage.put_stream("versions/v/u/a.bin", chunks_of(data), max_size=11 * MiB)
    with pytest.raises(ConnectionResetError):
        await s3_storage.put_stream("versions/v/u/b.bin", failing_after(data, 11 * MiB))
    assert await asyncio.to_thread(bucket_keys, s3_storage) == []
    assert await asyncio.to_thread(open_uploads, s3_storage) == []


async def test_delete_delete_prefix_and_missing_objects(s3_storage: S3Storage) -> None:
    for name in ("a", "b", "c"):
        await s3_storage.put_stream(f"artifacts/x/{name}", chunks_of(name.encode()))
    await s3_storage.put_stream("artifacts/y/keep", chunks_of(b"keep"))
    await s3_storage.delete("artifacts/x/a")
    assert await s3_storage.delete_prefix("artifacts/x/") == 2
    assert [i.key async for i in s3_storage.list("")] == ["artifacts/y/keep"]
    with pytest.raises(ObjectNotFound):
        await s3_storage.stat("artifacts/x/b")
    with pytest.raises(ObjectNotFound):
        await s3_storage.read_bytes("artifacts/x/b")


async def test_purge_temp_aborts_stale_multipart_uploads(s3_storage: S3Storage) -> None:
    client = raw_client(s3_storage)
    await asyncio.to_thread(
        client.create_multipart_upload,
        Bucket=s3_storage.bucket,
        Key="registry/versions/v/u/crashed",
    )
    # moto reports every upload as initiated on 2010-11-10, so "older than" is tested around it.
    assert await s3_storage.purge_temp(datetime(2010, 1, 1, tzinfo=UTC)) == 0
    assert await s3_storage.purge_temp(datetime.now(UTC) - timedelta(minutes=5)) == 1
    assert await asyncio.to_thread(open_uploads, s3_storage) == []


async def test_presigned_download_url_serves_ranges_and_is_withheld_for_templates(
    s3_storage: S3Storage,
) -> None:
    data = payload(50_000, seed=4)
    await s3_storage.put_stream("artifacts/a/model.tensors", chunks_of(data))
    url = await s3_storage.download_url("artifacts/a/model.tensors", 600)
    assert url is not None and url.startswith(s3_storage.settings.endpoint_url or "")
    out = subprocess.run(
        ["curl", "-sf", "--range", "100-199", url], capture_output=True, check=True
    ).stdout
    assert out == data[100:200]
    assert await s3_storage.download_url("artifacts/a/model-rank-%03d.tensors", 600) is None
    assert s3_storage.tensorizer_uri("artifacts/a/model.tensors") is None


class NoClose(io.RawIOBase):
    """What a worker hands tensorizer: forwards to the sink, keeps it open on close()."""

    def __init__(self, sink: Sink) -> None:
        super().__init__()
        self.sink = sink

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self.sink.write(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.sink.seek(offset, whence)

    def tell(self) -> int:
        return self.sink.tell()

    def close(self) -> None:
        super().close()


def serialize_into(sink: Sink, module: Any) -> None:
    serializer = TensorSerializer(NoClose(sink))
    serializer.write_module(module)
    serializer.close()


async def test_tensorizer_writes_a_module_through_the_sink_bit_identical(
    s3_storage: S3Storage,
) -> None:
    module = model_of(40)
    expected = state_of(module)
    key = "artifacts/t1/model.tensors"

    def write() -> tuple[Any, bytes]:
        # Small parts and window so that parts leave memory long before tensorizer patches
        # each tensor's header at the end of write_module (the far back-writes).
        sink = s3_storage.open_sink(key, part_mb=5, window_parts=1)
        assert isinstance(sink, S3Sink)
        serialize_into(sink, module)
        stored = sink.commit()
        reference = io.BytesIO()
        serializer = TensorSerializer(NoClose(_BytesSink(reference)))
        serializer.write_module(module)
        serializer.close()
        return stored, reference.getvalue()

    stored, reference = await asyncio.to_thread(write)
    body = await s3_storage.read_bytes(key)
    assert body == reference  # byte for byte what tensorizer writes to a plain file
    assert stored.size == len(body) and stored.sha256 == sha256(body)
    assert await asyncio.to_thread(open_uploads, s3_storage) == []

    def load() -> list[tuple[str, Any]]:
        with (
            s3_storage.open_source(key) as source,
            TensorDeserializer(source, device="cpu", verify_hash=True) as deserializer,
        ):
            return [(name, tensor.clone()) for name, tensor in deserializer.items()]

    assert_same_tensors(await asyncio.to_thread(load), expected)
    url = await s3_storage.download_url(key, 600)
    assert url is not None

    def load_url() -> list[tuple[str, Any]]:
        with TensorDeserializer(url, device="cpu", num_readers=4, verify_hash=True) as deserializer:
            return [(name, tensor.clone()) for name, tensor in deserializer.items()]

    assert_same_tensors(await asyncio.to_thread(load_url), expected)


class _BytesSink(Sink):
    """An in-memory reference sink (what a plain file would hold)."""

    def __init__(self, buffer: io.BytesIO) -> None:
        self.buffer = buffer

    def write(self, data: Any) -> int:
        return self.buffer.write(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.buffer.seek(offset, whence)

    def tell(self) -> int:
        return self.buffer.tell()

    def commit(self) -> Any:
        raise NotImplementedError

    def abort(self) -> None:
        return None


@pytest.mark.parametrize("window", [1, 3])
async def test_sink_handles_gaps_back_writes_and_rewrites_anywhere(
    s3_storage: S3Storage, window: int
) -> None:
    """Random-access writes (holes, far back-writes, overwrites) give exactly a file's bytes."""
    reference = io.BytesIO()
    writes = [
        (0, payload(100, 1)),
        (200, payload(9 * MiB, 2)),  # hole at 100..200, crosses the 8 MiB head part
        (12 * MiB, payload(14 * MiB, 3)),  # jump forward: a hole of ~3 MiB
        (150, payload(50, 4)),  # fills the first hole
        (9 * MiB + 300, payload(2 * MiB, 5)),  # far back, into a part already uploaded
        (20 * MiB, payload(33, 6)),  # overwrite in the middle
        (5, payload(60, 7)),  # the header rewrite at the end
    ]

    def run() -> Any:
        sink = s3_storage.open_sink("artifacts/p/model.tensors", part_mb=5, window_parts=window)
        for offset, data in writes:
            sink.seek(offset)
            reference.seek(offset)
            assert sink.write(data) == len(data)
            reference.write(data)
        assert sink.tell() == reference.tell()
        return sink.commit()

    stored = await asyncio.to_thread(run)
    body = await s3_storage.read_bytes("artifacts/p/model.tensors")
    assert body == reference.getvalue()
    assert stored.sha256 == sha256(body) and stored.size == len(body)
    assert await asyncio.to_thread(open_uploads, s3_storage) == []


async def test_sink_abort_and_small_objects(s3_storage: S3Storage) -> None:
    def run() -> Any:
        sink = s3_storage.open_sink("artifacts/q/big", part_mb=5, window_parts=1)
        sink.write(payload(30 * MiB))
        sink.abort()
        small = s3_storage.open_sink("artifacts/q/small")
        small.write(b"hello")
        small.seek(1)
        small.write(b"E")
        return small.commit()

    stored = await asyncio.to_thread(run)
    assert stored.sha256 == sha256(b"hEllo")
    assert await asyncio.to_thread(bucket_keys, s3_storage) == ["registry/artifacts/q/small"]
    assert await asyncio.to_thread(open_uploads, s3_storage) == []


async def test_open_source_is_a_seekable_file(s3_storage: S3Storage) -> None:
    data = payload(10 * MiB + 7, seed=9)
    await s3_storage.put_stream("versions/v/u/w.bin", chunks_of(data, MiB))

    def run() -> None:
        with s3_storage.open_source("versions/v/u/w.bin") as fh:
            assert fh.read(10) == data[:10]
            fh.seek(9 * MiB)
            assert fh.read(2 * MiB) == data[9 * MiB :]
            fh.seek(-7, io.SEEK_END)
            assert fh.read() == data[-7:]
        with pytest.raises(ObjectNotFound):
            s3_storage.open_source("versions/v/u/missing")

    await asyncio.to_thread(run)
