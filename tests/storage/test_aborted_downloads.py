"""An aborted download on the streamed (S3, not presigned) path is logged as what it was
(issue 29 §5): status 499 with ``client_disconnected`` and the bytes actually sent, and
``tensor_registry_blob_bytes_served_total`` counts only those. uvicorn drops a body sent to a
closed connection silently, so the registry used to read the whole object from S3, log 200
with the full size and count every byte."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path
from typing import Any

import httpx

from harness.serve_process import ServeProcess, free_port
from harness.waiting import poll
from tensor_registry_server.storage.s3 import S3Storage
from tensor_registry_server.storage.signing import blob_url
from tests.storage.conftest import S3_KEY_ID, S3_SECRET, make_bucket, s3_settings
from tests.storage.helpers import blob_responses, bytes_served, request_lines

SIGNING_KEY = "aborted-downloads-signing-key-0123456789abcdef"
MiB = 1024 * 1024
SIZE = 24 * MiB


async def test_an_aborted_s3_download_logs_499_and_counts_only_bytes_sent(
    s3_endpoint: str, tmp_path: Path
) -> None:
    bucket = await asyncio.to_thread(make_bucket, s3_endpoint)
    storage = S3Storage(s3_settings(s3_endpoint, bucket, prefix="registry/"))
    key = f"artifacts/{uuid.uuid4()}/model.tensors"
    chunk = bytes(range(256)) * 4096  # 1 MiB

    async def body() -> Any:
        for _ in range(SIZE // MiB):
            yield chunk

    await storage.put_stream(key, body())
    await storage.close()
    server = ServeProcess(
        data_dir=tmp_path / "data",
        port=free_port(),
        env={
            "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
            "TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL": s3_endpoint,
            "TENSOR_REGISTRY_STORAGE__S3__BUCKET": bucket,
            "TENSOR_REGISTRY_STORAGE__S3__PREFIX": "registry/",
            "TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID": S3_KEY_ID,
            "TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY": S3_SECRET,
            "TENSOR_REGISTRY_STORAGE__S3__PRESIGN_DOWNLOADS": "false",
        },
    ).start()
    try:
        before = bytes_served(server.url, "s3")
        aborted = blob_responses(server.url, "s3", "499")
        url = blob_url(server.url, SIGNING_KEY.encode(), storage="s3", key=key, ttl=600)
        path = httpx.URL(url).path
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            # A small receive buffer keeps the server from pushing the whole object into it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            target = httpx.URL(url).raw_path.decode()
            sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            got = b""
            while len(got) < 256 * 1024:
                got += sock.recv(65536)
            assert got.startswith(b"HTTP/1.1 200 ")
        # The disconnect's own line can come first: wait for the request's.
        [request] = poll(
            lambda: [e for e in request_lines(server.lines, path) if e.get("event") == "request"],
            what="the request log line",
            timeout=30,
        )
        assert request["status"] == 499, "\n".join(server.lines[-8:])
        assert 0 < request["bytes_out"] < SIZE // 2, request
        assert any("client_disconnected" in line and path in line for line in server.lines), (
            "\n".join(server.lines[-20:])
        )
        served = bytes_served(server.url, "s3") - before
        assert 0 < served < SIZE // 2, served
        assert blob_responses(server.url, "s3", "499") == aborted + 1
    finally:
        server.stop()
