"""A real `tensor-registry serve` process on a free port: first start, bootstrap token, restart."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from harness.serve_process import ServeProcess, free_port
from harness.waiting import poll

TOKEN_RE = re.compile(r"trg_[A-Za-z0-9_-]{20,}")


def test_first_start_prints_an_admin_token_once_and_data_survives_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir=data_dir, port=free_port()).start()
    try:
        tokens = [m.group(0) for line in server.lines for m in [TOKEN_RE.search(line)] if m]
        assert len(tokens) == 1, server.lines
        # The line to paste, on its own; the JSON log line says where it is, not the token.
        [paste] = [line for line in server.lines if tokens[0] in line]
        assert paste == f"export TENSOR_REGISTRY_TOKEN={tokens[0]}\n", paste
        [logged] = [json.loads(x) for x in server.lines if "bootstrap_admin_token" in x]
        assert logged["level"] == "warning" and "stdout" in logged["message"], logged
        h = {"Authorization": f"Bearer {tokens[0]}"}
        r = httpx.post(f"{server.url}/api/v1/models", json={"name": "acme/persisted"}, headers=h)
        assert r.status_code == 201
        assert r.headers["x-request-id"]
        assert (data_dir / "registry.db").exists()
        assert oct((data_dir / "secrets" / "signing.key").stat().st_mode & 0o777) == "0o600"
    finally:
        server.stop()

    server.start()
    try:
        assert not any("trg_" in line for line in server.lines), "token printed twice"
        r = httpx.get(f"{server.url}/api/v1/models", params={"name": "acme/persisted"}, headers=h)
        assert r.status_code == 200 and len(r.json()["items"]) == 1
        assert httpx.get(f"{server.url}/").status_code == 200
    finally:
        server.stop()


def test_admin_token_from_environment_is_used_and_not_printed(tmp_path: Path) -> None:
    token = "trg_from-env-0123456789abcdefghijklmnop"
    server = ServeProcess(
        data_dir=tmp_path / "data", port=free_port(), env={"TENSOR_REGISTRY_ADMIN_TOKEN": token}
    ).start()
    try:
        assert not any(token in line for line in server.lines)
        r = httpx.get(
            f"{server.url}/api/v1/tokens/self", headers={"Authorization": f"Bearer {token}"}
        )
        assert r.status_code == 200 and r.json()["scopes"] == ["admin"]
    finally:
        server.stop()


def _exported_token(lines: list[str], env: dict[str, str]) -> str:
    """Runs the `export TENSOR_REGISTRY_TOKEN=...` line serve printed, as a user's fresh shell
    would: one without the registry's virtualenv on PATH."""
    # Its own plain line (stdout), not a field inside a JSON log line.
    [line] = [x.rstrip("\n") for x in lines if x.startswith("export TENSOR_REGISTRY_TOKEN=")]
    assert line.startswith("export TENSOR_REGISTRY_TOKEN=") and "<" not in line, line
    shell = subprocess.run(
        ["bash", "-c", f'{line}\nprintf %s "$TENSOR_REGISTRY_TOKEN"'],
        env={
            **env,
            "PATH": ":".join(
                p for p in os.environ["PATH"].split(":") if Path(p) != Path(sys.executable).parent
            ),
        },
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert shell.returncode == 0, shell.stderr
    return shell.stdout


def test_serve_prints_a_usable_export_line_first_start_and_later(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir=data_dir, port=free_port()).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    try:
        first = _exported_token(server.lines, env)
        assert TOKEN_RE.fullmatch(first), first
        r = httpx.get(
            f"{server.url}/api/v1/tokens/self", headers={"Authorization": f"Bearer {first}"}
        )
        assert r.status_code == 200 and r.json()["scopes"] == ["admin"]
    finally:
        server.stop()
    server.start()
    try:
        # Not shown again: the line mints a new admin token with the same settings instead.
        assert not any(first in line for line in server.lines)
        later = _exported_token(server.lines, env)
        assert TOKEN_RE.fullmatch(later) and later != first
        r = httpx.get(
            f"{server.url}/api/v1/tokens/self", headers={"Authorization": f"Bearer {later}"}
        )
        assert r.status_code == 200 and r.json()["scopes"] == ["admin"]
    finally:
        server.stop()
    token = "trg_from-env-0123456789abcdefghijklmnop"
    configured = ServeProcess(
        data_dir=tmp_path / "other", port=free_port(), env={"TENSOR_REGISTRY_ADMIN_TOKEN": token}
    ).start()
    try:
        assert not any(token in line for line in configured.lines)
        assert (
            _exported_token(configured.lines, {**env, "TENSOR_REGISTRY_ADMIN_TOKEN": token})
            == token
        )
    finally:
        configured.stop()


def test_a_start_with_its_worker_logs_no_broker_hostname_or_root_warnings(tmp_path: Path) -> None:
    """kombu's "No hostname was supplied" (the file-system broker has no host) and Celery's
    superuser warning (this worker accepts JSON only) said nothing a user can act on."""
    server = ServeProcess(data_dir=tmp_path / "data", port=free_port(), worker=True).start()
    try:
        # The worker has connected and sent its first heartbeat through the broker.
        poll(
            lambda: any("capabilities" in line for line in list(server.lines)),
            what="the worker's first heartbeat",
            timeout=180,
            detail=lambda: "".join(server.lines[-30:]),
        )
        lines = list(server.lines)
        assert any("Connected to" in line for line in lines), lines
        assert not [x for x in lines if "No hostname was supplied" in x], lines
        assert not [x for x in lines if "superuser privileges" in x], lines
    finally:
        server.stop()
