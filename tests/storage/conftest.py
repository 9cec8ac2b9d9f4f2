"""Real storage servers for storage tests (and for anyone else's tests that need them).

- ``s3_endpoint``: an S3 server over HTTP on loopback: ``moto_server`` started for the session
  on a free port, unless ``TEST_S3_ENDPOINT_URL`` points at one (MinIO, say).
- ``redis_url``: the running Redis (``TEST_REDIS_URL``, default db 15).
- ``s3_storage`` / ``redis_storage``: backends on a fresh bucket / key prefix per test.
- ``live_server``: a real ``tensor-registry serve --no-worker`` (uvicorn with the zero-copy
  protocol) on a free loopback port, for curl and tensorizer's own HTTP reader.

With CI=true a missing server fails the run instead of skipping it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tensor_registry_server.settings import RedisStorageSettings, S3Settings, Settings
from tensor_registry_server.storage.redis_store import RedisStorage
from tensor_registry_server.storage.s3 import S3Storage

IN_CI = os.environ.get("CI", "").lower() == "true"
ROOT = Path(__file__).resolve().parents[2]
S3_KEY_ID = "testing"
S3_SECRET = "testing-secret"
LIVE_SIGNING_KEY = "live-server-signing-key-0123456789abcdefghijklmnop"
LIVE_ADMIN_TOKEN = "trg_live-admin-token-0123456789abcdefghijklmnopqrst"


def _unavailable(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is required in CI and is not available")
    pytest.skip(f"{what} not available")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback test server
                return True
        except urllib.error.HTTPError:
            return True  # it answers
        except OSError:
            time.sleep(0.1)
    return False


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    configured = os.environ.get("TEST_S3_ENDPOINT_URL")
    if configured:
        if not _wait_http(configured, 5):
            _unavailable(f"the S3 server at {configured}")
        yield configured
        return
    binary = Path(sys.executable).with_name("moto_server")
    if not binary.exists():
        _unavailable("moto_server (pip install 'moto[server]')")
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if not _wait_http(url, 30, proc):
            _unavailable("moto_server (it did not start)")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def s3_settings(endpoint: str, bucket: str, **overrides: object) -> S3Settings:
    return S3Settings(
        endpoint_url=endpoint,
        access_key_id=S3_KEY_ID,  # type: ignore[arg-type]
        secret_access_key=S3_SECRET,  # type: ignore[arg-type]
        bucket=bucket,
        **overrides,  # type: ignore[arg-type]
    )


def make_bucket(endpoint: str) -> str:
    import boto3

    bucket = f"test-{uuid.uuid4().hex[:16]}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_KEY_ID,
        aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
async def s3_storage(s3_endpoint: str) -> AsyncIterator[S3Storage]:
    """An S3Storage on a fresh bucket, with a prefix (so prefix handling is exercised)."""
    bucket = await asyncio.to_thread(make_bucket, s3_endpoint)
    storage = S3Storage(s3_settings(s3_endpoint, bucket, prefix="registry/", multipart_chunk_mb=5))
    yield storage
    await storage.close()


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except Exception:
        _unavailable(f"Redis at {url}")
    return url


@pytest.fixture
async def redis_storage(redis_url: str) -> AsyncIterator[RedisStorage]:
    """A RedisStorage under a fresh key prefix, removed afterwards."""
    prefix = f"tr-test-{uuid.uuid4().hex[:12]}/"
    storage = RedisStorage(RedisStorageSettings(url=redis_url, prefix=prefix, chunk_mb=1))
    yield storage
    client = storage.client()
    names = [n async for n in client.scan_iter(match=f"{prefix}*", count=1000)]
    if names:
        await client.delete(*names)
    await storage.close()


@dataclass
class LiveServer:
    url: str
    pid: int
    data_dir: Path
    settings: Settings
    admin_token: str = LIVE_ADMIN_TOKEN

    def blob_url(self, storage: str, key: str, *, ttl: int = 600) -> str:
        from tensor_registry_server.storage.signing import blob_url

        return blob_url(self.url, LIVE_SIGNING_KEY.encode(), storage=storage, key=key, ttl=ttl)


@contextlib.contextmanager
def run_live_server(data_dir: Path, **env: str) -> Iterator[LiveServer]:
    port = free_port()
    environ = {
        **os.environ,
        "TENSOR_REGISTRY_DATA_DIR": str(data_dir),
        "TENSOR_REGISTRY_HOST": "127.0.0.1",
        "TENSOR_REGISTRY_PORT": str(port),
        "TENSOR_REGISTRY_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": LIVE_SIGNING_KEY,
        "TENSOR_REGISTRY_ADMIN_TOKEN": LIVE_ADMIN_TOKEN,
        "TENSOR_REGISTRY_LOG_LEVEL": "WARNING",
        **env,
    }
    for name in list(environ):
        if name.startswith("TENSOR_REGISTRY_DATABASE"):
            del environ[name]  # the embedded SQLite under data_dir
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensor_registry.cli", "serve", "--no-worker"],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if not _wait_http(f"{url}/healthz", 60, proc):
            raise RuntimeError(f"tensor-registry serve did not start (exit {proc.poll()})")
        settings = Settings(data_dir=data_dir, public_url=url)
        yield LiveServer(url=url, pid=proc.pid, data_dir=data_dir, settings=settings)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server for the session; tests put files under its local storage root."""
    if shutil.which("curl") is None:
        _unavailable("curl")
    with run_live_server(tmp_path_factory.mktemp("live") / "data") as server:
        yield server
