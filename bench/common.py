"""Helpers shared by the storage benchmarks: servers on loopback, test files, timing, RSS.

Every benchmark prints ratios against a baseline measured in the same run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SIGNING_KEY = "bench-signing-key-0123456789abcdefghijklmnopqrstuvwxyz"
ADMIN_TOKEN = "trg_bench-admin-token-0123456789abcdefghijklmnopqrstu"
GB = 1_000_000_000
MB = 1_000_000


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
from app.main import create_app
from app.settings import Settings
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
    command = [sys.executable, "-m", "app.client.cli", "serve", "--no-worker"]
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

    ``variant="stock-uvloop"`` / ``"stock-asyncio"``: the same app under plain uvicorn.
    """
    env = {
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
        "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        **extra_env,
    }
    if variant == "serve":
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


def server_pid(base_url: str) -> int:
    """The pid listening on the base URL's port (the API process)."""
    port = int(base_url.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return int(conn.pid)
    raise RuntimeError(f"nothing listens on {port}")


@contextlib.contextmanager
def nginx_server(root: Path) -> Iterator[str]:
    """Debian's nginx (``sendfile on``) serving ``root`` on a loopback port, not a daemon."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise SystemExit("nginx is missing: apt-get install -y nginx-light")
    port = free_port()
    conf_dir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    (conf_dir / "nginx.conf").write_text(
        textwrap.dedent(
            f"""
            worker_processes auto;
            daemon off;
            pid {conf_dir}/nginx.pid;
            error_log {conf_dir}/error.log warn;
            events {{ worker_connections 1024; }}
            http {{
                access_log off;
                sendfile on;
                tcp_nopush on;
                client_body_temp_path {conf_dir}/body;
                proxy_temp_path {conf_dir}/proxy;
                fastcgi_temp_path {conf_dir}/fastcgi;
                uwsgi_temp_path {conf_dir}/uwsgi;
                scgi_temp_path {conf_dir}/scgi;
                server {{
                    listen 127.0.0.1:{port};
                    root {root};
                }}
            }}
            """
        )
    )
    proc = subprocess.Popen([binary, "-c", str(conf_dir / "nginx.conf"), "-p", str(conf_dir)])
    try:
        # Not an HTTP probe: GET / answers 403 (no index), which urlopen raises on until its
        # deadline; a listening port is what counts.
        _wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(conf_dir, ignore_errors=True)


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def write_tensorized(path: Path, size_bytes: int, *, tensor_mb: int = 32) -> int:
    """A tensorizer file of about ``size_bytes`` (float32 tensors); returns its size."""
    import torch
    from tensorizer import TensorSerializer

    path.parent.mkdir(parents=True, exist_ok=True)
    per_tensor = tensor_mb * 1024 * 1024 // 4
    count = max(1, size_bytes // (per_tensor * 4))
    generator = torch.Generator().manual_seed(0)
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
