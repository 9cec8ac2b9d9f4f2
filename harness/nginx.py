"""Debian's nginx as a process of the caller's (never the system service): a private folder
holds its main config, pid, logs and temp paths; ``http_conf`` is what goes in its ``http``
block. Its workers run as the caller (as root they would become ``nobody``, who cannot read a
private temporary folder)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.waiting import poll


def binary() -> str:
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(found).exists():
        raise RuntimeError("nginx is missing: apt-get install -y nginx (scripts/test does)")
    return found


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def running(http_conf: str, port: int, *, workers: str = "1") -> Iterator[Path]:
    """nginx with ``http_conf`` inside its http block, until the block ends; yields its folder
    (``error.log`` is there). Waits until ``port`` accepts connections."""
    folder = Path(tempfile.mkdtemp(prefix="nginx-"))
    (folder / "nginx.conf").write_text(
        textwrap.dedent(
            f"""
            {"user root;" if os.geteuid() == 0 else ""}
            worker_processes {workers};
            daemon off;
            pid {folder}/nginx.pid;
            error_log {folder}/error.log warn;
            events {{ worker_connections 1024; }}
            http {{
                access_log off;
                client_body_temp_path {folder}/body;
                proxy_temp_path {folder}/proxy;
                fastcgi_temp_path {folder}/fastcgi;
                uwsgi_temp_path {folder}/uwsgi;
                scgi_temp_path {folder}/scgi;
                include {folder}/site.conf;
            }}
            """
        )
    )
    (folder / "site.conf").write_text(http_conf)
    proc = subprocess.Popen([binary(), "-c", str(folder / "nginx.conf"), "-p", str(folder)])
    try:
        poll(
            lambda: proc.poll() is not None or _listening(port),
            what=f"nginx listening on {port}",
            timeout=30,
        )
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {(folder / 'error.log').read_text()[-2000:]}")
        yield folder
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
