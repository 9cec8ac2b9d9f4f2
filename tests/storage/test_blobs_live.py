"""The byte paths on a real `tensor-registry serve`: curl, tensorizer's HTTP reader, big uploads.

One server for the module (uvicorn + the zero-copy protocol, SQLite, local storage).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from tensorizer import TensorDeserializer, TensorSerializer

from harness.loopback import uvicorn_serving
from harness.waiting import poll
from tensor_registry_server.blobs.zerocopy import ZEROCOPY_SEND, ZeroCopyHttpProtocol
from tensor_registry_server.storage.s3 import S3Storage
from tests.storage.conftest import LiveServer
from tests.storage.helpers import assert_same_tensors, model_of, payload, state_of

MiB = 1024 * 1024


def curl(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["curl", "-s", *args], capture_output=True, timeout=60)


def put(live: LiveServer, key: str, data: bytes) -> Path:
    path = live.settings.local_storage_root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def status_line(raw: bytes) -> str:
    return raw.split(b"\r\n", 1)[0].decode()


def test_curl_range_head_expired_tampered_and_foreign_urls(live_server: LiveServer) -> None:
    data = payload(3 * MiB + 11)
    key = f"artifacts/{uuid.uuid4()}/model.tensors"
    put(live_server, key, data)
    url = live_server.blob_url("local", key)

    ranged = curl("--include", "--range", "1000-1999", url).stdout
    head, body = ranged.split(b"\r\n\r\n", 1)
    assert status_line(ranged) == "HTTP/1.1 206 Partial Content"
    assert body == data[1000:2000]
    assert f"content-range: bytes 1000-1999/{len(data)}".encode() in head.lower()

    full = curl(url).stdout
    assert full == data

    headers = curl("-I", url).stdout.decode().lower()
    assert headers.startswith("http/1.1 200")
    assert f"content-length: {len(data)}" in headers
    assert "accept-ranges: bytes" in headers and "etag: " in headers

    expired = live_server.blob_url("local", key, ttl=-10)
    r = curl("-w", "%{http_code}", "-o", "/dev/null", expired)
    assert r.stdout == b"403"
    assert b'"signature_expired"' in curl(expired).stdout

    tampered = url[:-3] + ("abc" if not url.endswith("abc") else "xyz")
    assert b'"signature_invalid"' in curl(tampered).stdout

    other_key = f"artifacts/{uuid.uuid4()}/model.tensors"
    put(live_server, other_key, b"not yours")
    foreign = live_server.blob_url("local", key).replace(key, other_key)
    assert b'"signature_invalid"' in curl(foreign).stdout

    missing = url.replace("model.tensors", "missing.tensors")
    assert curl("-w", "%{http_code}", "-o", "/dev/null", missing).stdout == b"404"


def test_keep_alive_connection_serves_several_ranges(live_server: LiveServer) -> None:
    data = payload(2 * MiB, seed=2)
    key = f"artifacts/{uuid.uuid4()}/model.tensors"
    put(live_server, key, data)
    url = live_server.blob_url("local", key)
    with httpx.Client(http1=True) as client:  # one pooled connection, reused
        for start in (0, 5, MiB, 2 * MiB - 1):
            r = client.get(url, headers={"Range": f"bytes={start}-{start + 99}"})
            assert r.status_code == 206 and r.content == data[start : start + 100]
        assert client.get(url).content == data


def _write_tensors(path: Path, module: Any) -> None:
    serializer = TensorSerializer(str(path))
    serializer.write_module(module)
    serializer.close()


def _load(uri: str, readers: int) -> list[tuple[str, Any]]:
    with TensorDeserializer(uri, device="cpu", num_readers=readers, verify_hash=True) as d:
        return [(name, tensor.clone()) for name, tensor in d.items()]


async def test_tensorizer_reads_identical_tensors_through_local_and_s3_urls(
    live_server: LiveServer, s3_storage: S3Storage, tmp_path: Path
) -> None:
    module = model_of(12, seed=5)
    expected = state_of(module)
    key = f"artifacts/{uuid.uuid4()}/model.tensors"
    local = live_server.settings.local_storage_root / key
    local.parent.mkdir(parents=True)
    await asyncio.to_thread(_write_tensors, local, module)

    local_url = live_server.blob_url("local", key)
    for readers in (1, 4):
        assert_same_tensors(await asyncio.to_thread(_load, local_url, readers), expected)

    data = local.read_bytes()

    async def one_chunk() -> Any:
        yield data

    await s3_storage.put_stream(key, one_chunk())
    s3_url = await s3_storage.download_url(key, 600)
    assert s3_url is not None
    assert_same_tensors(await asyncio.to_thread(_load, s3_url, 4), expected)


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def _draft(live: LiveServer, client: httpx.Client) -> tuple[str, int]:
    r = client.post("/api/v1/models", json={"name": f"acme/m-{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    model_id = r.json()["id"]
    r = client.post(f"/api/v1/models/{model_id}/versions", json={})
    assert r.status_code == 201, r.text
    return model_id, r.json()["version"]


@pytest.mark.slow
def test_upload_larger_than_the_memory_bound_keeps_rss_flat(
    live_server: LiveServer, tmp_path: Path
) -> None:
    size = int(os.environ.get("TEST_BIG_UPLOAD_BYTES", 400 * 1000 * 1000))
    source = tmp_path / "big.safetensors"
    with open(source, "wb") as fh:
        block = payload(4 * MiB, seed=7)
        for _ in range(size // len(block)):
            fh.write(block)
        fh.write(block[: size % len(block)])
    digest = hashlib.sha256()
    with open(source, "rb") as fh:
        while chunk := fh.read(8 * MiB):
            digest.update(chunk)
    headers = {"Authorization": f"Bearer {live_server.admin_token}"}
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=120) as client:
        model_id, number = _draft(live_server, client)
        before = _vm_hwm_kib(live_server.pid)
        result = curl(
            "-X", "PUT", "-T", str(source),
            "-H", f"Authorization: Bearer {live_server.admin_token}",
            "-H", "Content-Type: application/octet-stream",
            f"{live_server.url}/api/v1/models/{model_id}/versions/{number}/files/model.safetensors",
        )  # fmt: skip
        after = _vm_hwm_kib(live_server.pid)
    body = result.stdout.decode()
    assert '"sha256":"' + digest.hexdigest() + '"' in body.replace(" ", ""), body
    grown_mib = (after - before) / 1024
    # The upload streams in 4 MiB batches (two in flight): the process's peak barely moves.
    assert grown_mib < 48, f"peak RSS grew by {grown_mib:.0f} MiB for a {size / MiB:.0f} MiB upload"
    assert after / 1024 < 256


def test_interrupted_upload_leaves_nothing(live_server: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {live_server.admin_token}"}
    tmp_dir = live_server.settings.local_storage_root / ".tmp"
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=30) as client:
        model_id, number = _draft(live_server, client)
        before = set(tmp_dir.iterdir()) if tmp_dir.exists() else set()
        host, port = live_server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            request = (
                f"PUT /api/v1/models/{model_id}/versions/{number}/files/model.safetensors "
                "HTTP/1.1\r\n"
                f"Host: {host}\r\nAuthorization: Bearer {live_server.admin_token}\r\n"
                "Content-Type: application/octet-stream\r\nContent-Length: 100000000\r\n\r\n"
            )
            sock.sendall(request.encode())
            sock.sendall(payload(20 * MiB, seed=3))
            poll(
                lambda: tmp_dir.exists() and set(tmp_dir.iterdir()) - before,
                what="the server mid-upload, with a temp file open",
                timeout=30,
            )
        poll(
            lambda: set(tmp_dir.iterdir()) <= before,
            what="the interrupted upload's temp file to be removed",
            timeout=10,
        )
        version = client.get(f"/api/v1/models/{model_id}/versions/{number}").json()
        assert version["files"] == []
    version_dir = live_server.settings.local_storage_root / "versions" / version["id"]
    assert not version_dir.exists() or not [p for p in version_dir.rglob("*") if p.is_file()]


def test_zero_copy_protocol_advertises_and_sends_files(tmp_path: Path) -> None:
    """The protocol on its own: extension in the scope, sendfile bodies, plain bodies, HEAD."""
    data = payload(5 * MiB + 3, seed=11)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append(scope.get("extensions", {}))
        if scope["path"] == "/plain":
            body = b"plain"
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-length", b"5")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        offset, count = (100, 1000) if scope["path"] == "/part" else (0, len(data))
        headers = [(b"content-length", str(count + 4).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"pre:", "more_body": True})
        with open(path, "rb") as fh:
            await send(
                {
                    "type": ZEROCOPY_SEND,
                    "file": fh,
                    "offset": offset,
                    "count": count,
                    "more_body": False,
                }
            )

    with uvicorn_serving(app, http=ZeroCopyHttpProtocol) as (base, _):
        with httpx.Client() as client:
            assert client.get(f"{base}/whole").content == b"pre:" + data
            assert client.get(f"{base}/part").content == b"pre:" + data[100:1100]
            assert client.get(f"{base}/plain").content == b"plain"
            assert client.head(f"{base}/whole").headers["content-length"] == str(len(data) + 4)
            assert client.get(f"{base}/whole").content == b"pre:" + data  # same connection again
        assert all(ZEROCOPY_SEND in extensions for extensions in seen)
