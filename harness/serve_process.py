"""Start and stop a real `tensor-registry serve` process for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_ticks(pid: int) -> int:
    """User + system CPU a live process has used so far, in clock ticks (Linux /proc; a tick
    is 1 / os.sysconf("SC_CLK_TCK") s)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@dataclass
class ServeProcess:
    data_dir: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    worker: bool = False
    # False: leave public_url unset, so serve derives it from what it listens on.
    set_public_url: bool = True
    proc: subprocess.Popen[str] | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> ServeProcess:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
        args = [
            sys.executable,
            "-m",
            "tensor_registry.cli",
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
        ]
        if not self.worker:
            args.append("--no-worker")
        self.lines = []
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env={
                **({"TENSOR_REGISTRY_PUBLIC_URL": self.url} if self.set_public_url else {}),
                **clean,
                **self.env,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out = self.proc.stdout
        threading.Thread(target=lambda: self.lines.extend(out), daemon=True).start()  # type: ignore[arg-type]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("serve exited early:\n" + "\n".join(self.lines))
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("serve did not become ready:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
