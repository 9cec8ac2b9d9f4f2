"""Helpers shared by the benchmarks: servers on loopback (the registry, nginx, moto, a resolve
stand-in), test files, timing, RSS.

Every benchmark prints ratios against a baseline measured in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psutil

ROOT = Path(__file__).resolve().parent.parent
SIGNING_KEY = "bench-signing-key-0123456789abcdefghijklmnopqrstuvwxyz"
ADMIN_TOKEN = "trg_bench-admin-token-0123456789abcdefghijklmnopqrstu"
GB = 1_000_000_000
MB = 1_000_000


def bench_dirs(workdir: str, out: str) -> tuple[Path, Path]:
    """A bench's work folder (its test files) and output folder (its JSON), both made."""
    work, results = Path(workdir), Path(out)
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    return work, results


def failed_arm(rows: dict[str, Any], name: str, exc: BaseException, width: int = 34) -> None:
    """An arm that raised: its row says why, and the run goes on with the other arms."""
    rows[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"{name:{width}s} FAILED {exc}", flush=True)
    traceback.print_exc()


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def work_dir(label: str) -> Path:
    base = Path(os.environ.get("BENCH_DIR", tempfile.gettempdir()))
    path = Path(tempfile.mkdtemp(prefix=f"bench-{label}-", dir=base))
    path.chmod(0o755)  # nginx's workers run as an unprivileged user
    return path


# Stock uvicorn around the same app, for comparison: no zero-copy extension, so blob bodies are
# streamed through ASGI body messages (what a plain FileResponse does).
STOCK_SERVER = """
import sys, uvicorn
from tensor_registry_server.main import create_app
from tensor_registry_server.settings import Settings
settings = Settings()
uvicorn.run(create_app(settings), host="127.0.0.1", port=settings.port, loop=sys.argv[1],
            http="httptools", log_level="warning")
"""


@contextlib.contextmanager
def _running_until_ready(
    command: list[str], env: dict[str, str], ready_url: str, timeout: float = 90.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `command` in the repo root, wait until `ready_url` answers, stop it on exit."""
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{command[2:5]} exited early")
            try:
                with urllib.request.urlopen(ready_url, timeout=2):
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{command[2:5]} did not become ready") from None
                time.sleep(0.2)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def serve_no_worker(data_dir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """`tensor-registry serve --no-worker` on a free loopback port; yields its base URL once
    /readyz answers. None of the caller's TENSOR_REGISTRY_* variables leak in, only `env`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    command = [sys.executable, "-m", "tensor_registry.cli", "serve", "--no-worker"]
    command += ["--port", str(port), "--data-dir", str(data_dir)]
    full_env = {
        **clean,
        "TENSOR_REGISTRY_PUBLIC_URL": url,
        "TENSOR_REGISTRY_LOG_LEVEL": "WARNING",
        **(env or {}),
    }
    with _running_until_ready(command, full_env, f"{url}/readyz"):
        yield url


@contextlib.contextmanager
def registry_server(data_dir: Path, *, variant: str = "serve", **extra_env: str) -> Iterator[str]:
    """`tensor-registry serve --no-worker` on a free loopback port; yields its base URL.

    ``variant="stock-uvloop"`` / ``"stock-asyncio"``: the same app under plain uvicorn;
    ``"serve-loop"``: serve with every sendfile on the event loop (``http.sendfile_threads`` 0).
    """
    env = {
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
        "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        **extra_env,
    }
    if variant in ("serve", "serve-loop"):
        if variant == "serve-loop":
            env["TENSOR_REGISTRY_HTTP__SENDFILE_THREADS"] = "0"
        with serve_no_worker(data_dir, env) as url:
            yield url
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stock_env = {
        **os.environ,
        "TENSOR_REGISTRY_DATA_DIR": str(data_dir),
        "TENSOR_REGISTRY_HOST": "127.0.0.1",
        "TENSOR_REGISTRY_PORT": str(port),
        "TENSOR_REGISTRY_PUBLIC_URL": url,
        "TENSOR_REGISTRY_LOG_LEVEL": "WARNING",
        **env,
    }
    command = [sys.executable, "-c", STOCK_SERVER, variant.removeprefix("stock-")]
    with _running_until_ready(command, stock_env, f"{url}/healthz"):
        yield url


def serving_processes(base_url: str) -> list[psutil.Process]:
    """The processes answering on the base URL's port: the one listening, climbing to its
    parent while that has the same name (nginx's master), with all their children (nginx's
    workers)."""
    top = psutil.Process(server_pid(base_url))
    while (parent := top.parent()) is not None and parent.name() == top.name():
        top = parent
    return [top, *top.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User + system CPU seconds the processes have used so far (all their threads)."""
    total = 0.0
    for process in processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


def server_pid(base_url: str) -> int:
    """The pid listening on the base URL's port (the API process)."""
    port = int(base_url.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return int(conn.pid)
    raise RuntimeError(f"nothing listens on {port}")


@contextlib.contextmanager
def nginx_server(root: Path, locations: str = "") -> Iterator[str]:
    """Debian's nginx (``sendfile on``) serving ``root`` on a loopback port (harness.nginx);
    ``locations``: more directives for its ``server`` block (location blocks, headers)."""
    from harness import nginx

    port = free_port()
    site = f"""
        sendfile on;
        tcp_nopush on;
        server {{
            listen 127.0.0.1:{port};
            root {root};
            {locations}
        }}
    """
    with nginx.running(site, port, workers="auto"):
        yield f"http://127.0.0.1:{port}"


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def write_tensorized(path: Path, size_bytes: int, *, tensor_mb: int = 32, seed: int = 0) -> int:
    """A tensorizer file of about ``size_bytes`` (float32 tensors); returns its size."""
    import torch
    from tensorizer import TensorSerializer

    path.parent.mkdir(parents=True, exist_ok=True)
    per_tensor = tensor_mb * 1024 * 1024 // 4
    count = max(1, size_bytes // (per_tensor * 4))
    generator = torch.Generator().manual_seed(seed)
    serializer = TensorSerializer(str(path))
    state = {f"layer.{i}.weight": torch.rand(per_tensor, generator=generator) for i in range(count)}
    serializer.write_state_dict(state)
    serializer.close()
    return path.stat().st_size


def best_of(runs: int, fn) -> float:  # type: ignore[no-untyped-def]
    """The fastest of ``runs`` timings of ``fn()`` in seconds (the least disturbed run)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def gbps(size: int, seconds: float) -> float:
    return size / seconds / GB


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server on a loopback port (the same server the tests use)."""
    binary = Path(sys.executable).with_name("moto_server")
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---------------------------------------------------------------------------------------------
# The registry played on loopback, for GPU machines without its server stack:
# bench/engine/gpu_load.py's signed range server serves the files, resolve_server answers what GET
# /api/v1/resolve answers.


def publish_files(directory: Path, weights: list[str]) -> list[dict[str, Any]]:
    """What publishing adds to the tensorizer files ``weights`` in ``directory``: their layout
    manifest (tensors.layout.json, as tensor_registry_server/artifacts/making/layout_writer.py
    writes it);
    returns the
    artifact's files as a resolve answer lists them (no URLs yet)."""
    from tensor_registry.formats.layout import LAYOUT_FILE, ArtifactLayout, build_file_layout

    layouts = []
    for name in weights:
        with (directory / name).open("rb") as fh:
            size = (directory / name).stat().st_size
            layouts.append(build_file_layout(fh, name, size=size, threads=os.cpu_count() or 4))
    (directory / LAYOUT_FILE).write_bytes(ArtifactLayout(files=tuple(layouts)).dumps())
    files = []
    for name, kind in [*((n, "weights") for n in weights), (LAYOUT_FILE, "layout")]:
        digest = hashlib.sha256()
        with (directory / name).open("rb") as fh:
            while block := fh.read(64 << 20):
                digest.update(block)
        size = (directory / name).stat().st_size
        files.append({"path": name, "size": size, "sha256": digest.hexdigest(), "kind": kind})
    return files


def advised_readers(cpu_count: int | None) -> int:
    """tensorizer's readers as tensor_registry_server/resolve/render.py advises them (half the
    cores, 1..16)."""
    return max(1, min(16, (cpu_count or 8) // 2))


def resolve_answer(
    name: str,
    fmt: str,
    tp: int,
    files: list[dict[str, Any]],
    sign: Callable[[str], str],
    prefix: str,
    *,
    dtype: str = "bfloat16",
    version: int = 1,
) -> dict[str, Any]:
    """A resolve answer for an unencrypted artifact whose ``files`` lie under ``prefix`` of the
    signed server (resolve_server adds the engine advice for each caller)."""
    files = [{**f, "url": sign(f"{prefix}/{f['path']}")} for f in files]
    weights = [f["url"] for f in files if f["kind"] == "weights"]
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3000))
    readers = advised_readers(os.cpu_count())
    return {
        "model": name,
        "version": version,
        "artifact": {
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{version}/{fmt}/{tp}")),
            "dtype": dtype,
            "format": fmt,
            "tensor_parallel_size": tp,
            "encryption": {"enabled": False},
        },
        "expires_at": expires,
        "files": files,
        "tensorizer_uri": weights[0],
        "tensorizer_uris": weights,
        "deserializer": {"num_readers": readers, "verify_hash": True},
        # What the answer's vllm block advises a node without the plugin (tensorizer's reader).
        "vllm": {
            "model_loader_extra_config": {
                "tensorizer_uri": weights[0],
                "num_readers": readers,
                "verify_hash": True,
            }
        },
    }


class _ResolveHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answers: dict[str, dict[str, Any]]

    def log_message(self, *_: Any) -> None:
        return None

    def do_GET(self) -> None:
        from tensor_registry_server.resolve.advice import engine_advice

        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        answer = self.answers.get(query.get("model", ""))
        artifact = answer["artifact"] if answer else {}
        ok = (
            parts.path == "/api/v1/resolve"
            and answer is not None
            and query.get("format") in (None, artifact["format"])
            and query.get("dtype") in (None, artifact["dtype"])
            and int(query.get("tensor_parallel_size", artifact["tensor_parallel_size"]))
            == artifact["tensor_parallel_size"]
        )
        if ok:
            assert answer is not None
            cores = int(query["cpu_count"]) if "cpu_count" in query else None
            advice = engine_advice(
                paths=[f["path"] for f in answer["files"]],
                encrypted=False,
                cpu_count=cores,
                gpu=query.get("gpu") == "true",
                verify=True,
            )
            body = json.dumps({**answer, "engine": advice}).encode()
        else:
            body = json.dumps(
                {"code": "no_matching_artifact", "detail": "no such variant"}
            ).encode()
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json" if ok else "application/problem+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def resolve_server(answers: dict[str, dict[str, Any]]) -> Iterator[str]:
    """GET /api/v1/resolve on a loopback port answering ``answers`` (by model name; format,
    dtype and tensor-parallel size must fit, else 404 no_matching_artifact); yields the URL."""
    from harness.loopback import serving

    with serving(type("Handler", (_ResolveHandler,), {"answers": answers})) as url:
        yield url


# ---------------------------------------------------------------------------------------------
# The scaled registry's pieces for benches that start it themselves (bench/fleet,
# bench/serving/resolve_load.py).


async def postgres_sql(admin_url: str, sql: str) -> None:
    """One statement on PostgreSQL outside a transaction (CREATE/DROP DATABASE)."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


def ready_versions(base_url: str, token: str, name: str, versions: int = 1) -> dict[str, Any]:
    """Model ``name`` with ``versions`` finalized versions (a minimal config + safetensors)."""
    import httpx

    payload = struct.pack("<4f", 0, 1, 2, 3)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    header += b" " * (-len(header) % 8)
    weights = struct.pack("<Q", len(header)) + header + payload
    config = b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as http:
        model = http.post("/api/v1/models", json={"name": name}).json()
        for number in range(1, versions + 1):
            http.post(f"/api/v1/models/{model['id']}/versions", json={}).raise_for_status()
            for path, data in (("config.json", config), ("model.safetensors", weights)):
                http.put(
                    f"/api/v1/models/{model['id']}/versions/{number}/files/{path}",
                    content=data,
                    headers={"Content-Type": "application/octet-stream"},
                ).raise_for_status()
            http.post(f"/api/v1/models/{model['id']}/versions/{number}/finalize").raise_for_status()
        return dict(model)


def insert_artifact(
    database_url: str,
    model: str,
    version: int,
    artifact_id: uuid.UUID,
    prefix: str,
    files: list[tuple[str, int, str]],
    *,
    storage: str,
    variant: dict[str, Any],
) -> None:
    """The ready rows of an artifact whose files (path, size, sha256) are already stored under
    ``prefix``: what the worker's publish writes, for benches that make artifacts directly."""
    from sqlalchemy import select

    from tensor_registry_server.core.db import (
        create_engine,
        make_sessionmaker,
        session_scope,
        utcnow,
    )
    from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile
    from tensor_registry_server.rows.models import Model
    from tensor_registry_server.rows.versions import Version

    async def insert() -> None:
        engine = create_engine(database_url)
        try:
            async with session_scope(make_sessionmaker(engine)) as session:
                model_id, version_id = (
                    await session.execute(
                        select(Model.id, Version.id)
                        .join(Version, Version.model_id == Model.id)
                        .where(Model.name == model, Version.number == version)
                    )
                ).one()
                session.add(
                    Artifact(
                        id=artifact_id,
                        model_id=model_id,
                        version_id=version_id,
                        version_number=version,
                        dtype=variant.get("dtype", "bfloat16"),
                        format=variant.get("format", "hf"),
                        tensor_parallel_size=variant.get("tensor_parallel_size", 1),
                        encrypted=False,
                        storage=storage,
                        storage_prefix=prefix,
                        status="ready",
                        tensorizer_version="2.12.1",
                        ready_at=utcnow(),
                        files=[
                            ArtifactFile(path=p, size=n, sha256=d, storage_key=prefix + p)
                            for p, n, d in files
                        ],
                    )
                )
        finally:
            await engine.dispose()

    asyncio.run(insert())


def register_s3_artifact(
    env: dict[str, str], model: str, version: int, size: int, *, seed: int
) -> uuid.UUID:
    """A ready bfloat16/hf/tp1 artifact of ``model`` ``version`` on the registry's S3 storage
    (``env``: its TENSOR_REGISTRY_* settings): a tensorizer file of about ``size`` bytes and
    config.json uploaded, rows inserted, then `tensor-registry backfill-layouts` adds the
    layout and the signed manifest as it does for any artifact published without them."""
    import boto3

    from tensor_registry_server.storage.object_keys import artifact_prefix

    artifact_id = uuid.uuid4()
    prefix = artifact_prefix(artifact_id)
    work = Path(tempfile.mkdtemp(prefix="bench-artifact-"))
    try:
        weights = work / "model.tensors"
        write_tensorized(weights, size, tensor_mb=8, seed=seed)
        (work / "config.json").write_bytes(b'{"architectures": ["LlamaForCausalLM"]}')
        s3 = boto3.client(
            "s3",
            endpoint_url=env["TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL"],
            aws_access_key_id=env["TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID"],
            aws_secret_access_key=env["TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        files = []
        for path in ("model.tensors", "config.json"):
            data_path = work / path
            s3.upload_file(
                str(data_path), env["TENSOR_REGISTRY_STORAGE__S3__BUCKET"], prefix + path
            )
            digest = hashlib.sha256(data_path.read_bytes()).hexdigest()
            files.append((path, data_path.stat().st_size, digest))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    insert_artifact(
        env["TENSOR_REGISTRY_DATABASE__URL"],
        model,
        version,
        artifact_id,
        prefix,
        files,
        storage="s3",
        variant={"dtype": "bfloat16", "format": "hf", "tensor_parallel_size": 1},
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    subprocess.run(
        [sys.executable, "-m", "tensor_registry.cli", "backfill-layouts", "--model", model],
        cwd=ROOT,
        env={**clean, **env, "TENSOR_REGISTRY_DATA_DIR": tempfile.mkdtemp(prefix="backfill-")},
        check=True,
        capture_output=True,
    )
    return artifact_id


def llama_config(target_bytes: int, dtype_bytes: int, hidden: int = 2048) -> object:
    """A random-weight Llama shape of ``hidden`` width (heads of 128, MLP 2.75x) with as many
    layers as reach ``target_bytes`` at ``dtype_bytes`` per element."""
    from transformers import LlamaConfig

    intermediate, vocab = int(hidden * 2.75) // 256 * 256, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden
    fixed = 2 * vocab * hidden + hidden
    layers = max(1, round((target_bytes / dtype_bytes - fixed) / per_layer))
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=hidden // 128,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
