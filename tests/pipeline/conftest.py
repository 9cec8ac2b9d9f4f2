"""Fixtures that run the tensorize pipeline for real: the API in-process and a REAL Celery
worker process (``python -m tensor_registry.cli worker``) sharing its database and data dir.

Two stacks, each a session-scoped parameter with its own worker process:

- ``embedded``: SQLite, local storage, kombu's file-system broker (what ``serve`` runs);
- ``scaled``: PostgreSQL, local storage, Redis broker + Redis pub/sub for job events
  (``redis://127.0.0.1:6379/14``, or TEST_REDIS_URL). With CI=true a missing Redis or
  PostgreSQL fails the run instead of skipping.

The worker heartbeats every 0.3 s and counts as dead 5 s after its last one, so the tests
that kill it do not wait long, yet a heartbeat thread starved of a core for a few seconds on a
loaded 2-core CI machine does not read as a dead worker (a 409 no_capable_worker flake at 3 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tensor_registry_server.settings import Settings
from tests.conftest import ADMIN_TOKEN, IN_CI, deselect_copies, migrated_database
from tests.stage_hold import StageHold

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
# This session's broker keys: test runs that share the Redis never take each other's messages.
BROKER_KEY_PREFIX = f"tr-test-{uuid.uuid4().hex[:12]}:"
ROOT = Path(__file__).resolve().parents[2]
WORKER_SETTINGS = {
    "heartbeat_seconds": 0.3,
    "live_after_seconds": 5.0,
    "progress_interval_seconds": 0.05,
    "retry_backoff_seconds": 0.2,
    "max_attempts": 2,
    # Small enough for a sparse file to exceed it (test_register), far above the tiny models.
    "verify_max_bytes": 32 * 1024 * 1024,
}
# The fetcher may reach helper servers by the name "localhost" only: every literal loopback
# spelling (127.0.0.1, 0x7f000001, [::ffff:127.0.0.1]) stays refused for the attack tests.
FETCH_SETTINGS: dict[str, Any] = {"allow": ["localhost"], "max_bytes": 32 * 1024 * 1024}


def _redis_available(url: str) -> bool:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        client.ping()
        client.close()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session", params=["embedded", "scaled"])
def stack(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def redis_url(stack: str) -> str | None:
    if stack == "embedded":
        return None
    if not _redis_available(REDIS_URL):
        if IN_CI:
            pytest.fail(f"Redis is required in CI and is not reachable at {REDIS_URL}")
        pytest.skip(f"Redis not reachable at {REDIS_URL}")
    return REDIS_URL


@pytest.fixture(scope="session")
def database_url(stack: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Overrides the root fixture: SQLite for the embedded stack, PostgreSQL for the scaled."""
    backend = "sqlite" if stack == "embedded" else "postgresql"
    with migrated_database(backend, tmp_path_factory, label="pipeline") as url:
        yield url


@pytest.fixture(scope="session")
def pipeline_dir(stack: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp(f"pipeline-{stack}")
    (base / "data").mkdir()
    (base / "imports").mkdir()
    return base


@pytest.fixture
def embedded_only(stack: str) -> None:
    """Marks behaviour that does not depend on the broker: it runs once, on the embedded stack.

    The scaled copies are deselected at collection (pytest_collection_modifyitems below), so a
    CI run reports no skipped backend."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_copies(config, items, "embedded_only", "stack", "scaled")


@pytest.fixture
def data_dir(pipeline_dir: Path) -> Path:
    """Overrides the root fixture: the app and the worker share one data dir per stack."""
    return pipeline_dir / "data"


@pytest.fixture
def import_root(pipeline_dir: Path) -> Path:
    return pipeline_dir / "imports"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private Redis for the ``redis`` storage backend, which a test can kill mid-write
    (the shared Redis on 6379 carries the broker and must stay up)."""

    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            if IN_CI:
                pytest.fail("redis-server is required in CI")
            pytest.skip("redis-server is not installed")
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self.directory)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        import redis

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=1).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        pytest.fail("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="session")
def storage_redis(pipeline_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(pipeline_dir / "storage-redis")
    yield server
    server.kill()


def _settings_values(
    database_url: str,
    data_dir: Path,
    import_root: Path,
    redis_url: str | None,
    storage_redis: RedisServer,
) -> dict[str, Any]:
    return {
        "data_dir": data_dir,
        "database": {"url": database_url},
        "public_url": "http://testserver",
        "admin_token": ADMIN_TOKEN,
        "storage": {"import_roots": [str(import_root)], "redis": {"url": storage_redis.url}},
        "broker": {"url": redis_url, "redis_url": redis_url, "key_prefix": BROKER_KEY_PREFIX},
        "worker": WORKER_SETTINGS,
        "fetch": FETCH_SETTINGS,
    }


@pytest.fixture
def settings(
    database_url: str,
    data_dir: Path,
    import_root: Path,
    redis_url: str | None,
    storage_redis: RedisServer,
) -> Settings:
    return Settings(
        **_settings_values(database_url, data_dir, import_root, redis_url, storage_redis)
    )


class WorkerProcess:
    """A real ``tensor-registry worker`` process; restartable after a test kills it."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensor_registry.cli", "worker", "--concurrency", "1"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def node_id(self) -> str:
        import socket

        return f"{socket.gethostname()}:{self.pid}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pool_pids(self) -> list[int]:
        import psutil

        return [c.pid for c in psutil.Process(self.pid).children() if c.is_running()]

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@pytest.fixture(scope="session")
def worker(
    stack: str,
    database_url: str,
    pipeline_dir: Path,
    redis_url: str | None,
    storage_redis: RedisServer,
) -> Iterator[WorkerProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    env.update(
        {
            "TENSOR_REGISTRY_DATA_DIR": str(pipeline_dir / "data"),
            "TENSOR_REGISTRY_DATABASE__URL": database_url,
            "TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS": f'["{pipeline_dir / "imports"}"]',
            "TENSOR_REGISTRY_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **{f"TENSOR_REGISTRY_WORKER__{k.upper()}": str(v) for k, v in WORKER_SETTINGS.items()},
            "TENSOR_REGISTRY_STORAGE__REDIS__URL": storage_redis.url,
            "TENSOR_REGISTRY_FETCH__ALLOW": json.dumps(FETCH_SETTINGS["allow"]),
            "TENSOR_REGISTRY_FETCH__MAX_BYTES": str(FETCH_SETTINGS["max_bytes"]),
            "TENSOR_REGISTRY_WORKER__HOLD_DIR": str(pipeline_dir / "holds"),
        }
    )
    if redis_url:
        env["TENSOR_REGISTRY_BROKER__URL"] = redis_url
        env["TENSOR_REGISTRY_BROKER__REDIS_URL"] = redis_url
        env["TENSOR_REGISTRY_BROKER__KEY_PREFIX"] = BROKER_KEY_PREFIX
    # Both processes must agree on the embedded secrets file before either creates it.
    Settings(data_dir=pipeline_dir / "data").master_key_bytes()
    process = WorkerProcess(env, pipeline_dir / "worker.log")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def stage_hold(pipeline_dir: Path, worker: WorkerProcess) -> Iterator[StageHold]:
    hold = StageHold(pipeline_dir / "holds", worker.log_tail)
    hold.clear()
    yield hold
    hold.clear()  # a job still held (its process killed or stopped) is let go


@pytest.fixture
async def live_worker(client: httpx.AsyncClient, worker: WorkerProcess) -> dict[str, Any]:
    """The worker, once the registry lists it as live (the app fixture wiped its row)."""
    if not worker.alive():
        worker.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        r = await client.get("/api/v1/workers")
        assert r.status_code == 200, r.text
        for item in r.json()["items"]:
            if item["id"] == worker.node_id:
                return dict(item)
        if not worker.alive():
            pytest.fail(f"worker exited:\n{worker.log_tail()}")
        await asyncio.sleep(0.1)
    pytest.fail(f"worker never became live:\n{worker.log_tail()}")


@pytest.fixture
async def api(
    client: httpx.AsyncClient, live_worker: dict[str, Any]
) -> AsyncIterator[httpx.AsyncClient]:
    """The admin client, with a live worker behind it."""
    yield client


@pytest.fixture(scope="session")
def big_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Llama of about 180 MB (float32): serializing it takes long enough for a
    test to stop, kill or cancel the worker in the middle."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("big-llama")
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=256,
    )
    torch_seed = 3
    import torch

    torch.manual_seed(torch_seed)
    LlamaForCausalLM(config).save_pretrained(str(directory))
    return directory
