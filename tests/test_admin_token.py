"""`tensor-registry admin-token`: a lost bootstrap token does not lock the owner out.

The command talks to the database named by the same settings as `serve` (no HTTP), mints a root
admin token and prints it once on stdout; the token then works over HTTP.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from harness.serve_process import ROOT, ServeProcess, free_port
from tests.factories import auth
from tests.test_serve import TOKEN_RE


def _admin_token(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    return subprocess.run(
        [sys.executable, "-m", "tensor_registry.cli", "admin-token", *args],
        cwd=ROOT,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_admin_token_on_a_sqlite_data_dir_works_against_a_running_serve(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir=data_dir, port=free_port()).start()
    try:
        bootstrap = next(m.group(0) for line in server.lines if (m := TOKEN_RE.search(line)))
        done = _admin_token("--data-dir", str(data_dir), "--name", "rescue", "--expires-in", "2h")
        assert done.returncode == 0, done.stderr
        token = done.stdout.strip()
        assert TOKEN_RE.fullmatch(token) and token != bootstrap
        assert token not in done.stderr
        me = httpx.get(f"{server.url}/api/v1/tokens/self", headers=auth(token))
        assert me.status_code == 200, me.text
        body = me.json()
        assert body["name"] == "rescue" and body["scopes"] == ["admin"]
        assert body["parent_id"] is None
        expires = datetime.fromisoformat(body["expires_at"])
        assert timedelta(hours=1.9) < expires - datetime.now(UTC) <= timedelta(hours=2)
        # A full admin: it can revoke the (lost) bootstrap token.
        listed = httpx.get(f"{server.url}/api/v1/tokens", headers=auth(token)).json()["items"]
        lost = next(t for t in listed if t["name"] == "bootstrap-admin")
        r = httpx.delete(f"{server.url}/api/v1/tokens/{lost['id']}", headers=auth(token))
        assert r.status_code == 204
        r = httpx.get(f"{server.url}/api/v1/models", headers=auth(bootstrap))
        assert r.status_code == 401
    finally:
        server.stop()


async def test_admin_token_against_a_database_url(
    client: httpx.AsyncClient, database_url: str, tmp_path: Path
) -> None:
    """The same command on SQLite and PostgreSQL URLs (scaled deployments: no data dir DB)."""
    env = {"TENSOR_REGISTRY_DATABASE__URL": database_url}
    done = _admin_token("--data-dir", str(tmp_path / "cli-data"), env=env)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    me = await client.get("/api/v1/tokens/self", headers=auth(token))
    assert me.status_code == 200, me.text
    assert me.json()["scopes"] == ["admin"] and me.json()["expires_at"] is None
    events = (await client.get("/api/v1/audit", params={"action": "token.create"})).json()
    assert any(e["target_id"] == me.json()["id"] for e in events["items"])


def test_admin_token_refuses_a_bad_duration_and_an_unmigrated_database(tmp_path: Path) -> None:
    done = _admin_token("--data-dir", str(tmp_path / "d"), "--expires-in", "soon")
    assert done.returncode == 2 and "not a duration" in done.stderr
    done = _admin_token("--data-dir", str(tmp_path / "d"))
    assert done.returncode == 1 and "tensor-registry migrate" in done.stderr, done.stderr
    assert "trg_" not in done.stdout
