"""A real `serve` as deployed: signed URLs on the port it listens on, a supervised embedded
worker (killed, restarted, its job recovered), and jobs accepted before its first heartbeat."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.serve_process import ServeProcess, free_port
from harness.waiting import wait_job
from tensor_registry_server.settings import derive_public_url
from tests.hf_fixtures import make_tiny_llama
from tests.pipeline.helpers import publish_dir
from tests.stage_hold import StageHold

pytestmark = pytest.mark.slow

ADMIN = "trg_serve-deploy-0123456789abcdefghijklmn"


def _serve(tmp_path: Path, **kwargs: Any) -> ServeProcess:
    env = {
        "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN,
        "TENSOR_REGISTRY_WORKER__HEARTBEAT_SECONDS": "1",
        **kwargs.pop("env", {}),
    }
    return ServeProcess(data_dir=tmp_path / "data", port=free_port(), env=env, **kwargs)


def _client(server: ServeProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    )


async def _published(server: ServeProcess, tmp_path: Path, name: str) -> str:
    async with _client(server) as client:
        model_id, _ = await publish_dir(client, make_tiny_llama(tmp_path / "src"), name=name)
    return model_id


async def _wait_readyz(server: ServeProcess, status: int, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=server.url) as client:
        while True:
            r = await client.get("/readyz")
            if r.status_code == status:
                return dict(r.json())
            assert time.monotonic() < deadline, f"/readyz still {r.status_code}: {r.text}"
            await asyncio.sleep(0.02)


def test_public_url_is_derived_from_the_listen_address() -> None:
    assert derive_public_url("127.0.0.1", 9000) == "http://127.0.0.1:9000"
    assert derive_public_url("::1", 9000) == "http://[::1]:9000"
    wildcard = derive_public_url("0.0.0.0", 9000)
    assert wildcard.endswith(":9000") and "0.0.0.0" not in wildcard
    assert "[::]" not in derive_public_url("::", 9000)


async def test_serve_signed_urls_early_jobs_and_a_killed_worker(tmp_path: Path) -> None:
    """One serve (no public_url set) on a random port, three deployment defects:
    signed URLs on the port it listens on; a job sent before the embedded worker's first
    heartbeat is queued and runs; the worker killed with SIGKILL is reported by /readyz,
    restarted, and the job it was running succeeds on the new one."""
    # Publish first (no worker), so that the tensorize request below comes right after start.
    server = _serve(
        tmp_path,
        set_public_url=False,
        env={
            "TENSOR_REGISTRY_WORKER__RESTART_BACKOFF_SECONDS": "3",
            "TENSOR_REGISTRY_WORKER__HOLD_DIR": str(tmp_path / "holds"),
        },
    ).start()
    try:
        model_id = await _published(server, tmp_path, "acme/deployed")
    finally:
        server.stop()

    server.worker = True
    server.start()
    try:
        async with _client(server) as client:
            workers = (await client.get("/api/v1/workers")).json()["items"]
            r = await client.post(
                f"/api/v1/models/{model_id}/tensorize", json={"dtype": "float16", "format": "hf"}
            )
            # Before the embedded worker's first heartbeat the job is accepted and queued.
            assert workers == [], "the worker heartbeated before the request; test is moot"
            assert r.status_code == 202, r.text
            job = await wait_job(client, r.json()["id"], timeout=180)
            assert job["status"] == "succeeded", job
            await _signed_urls_download_from(server, client)
            await _kill_the_worker_while_a_job_runs(
                server, client, model_id, StageHold(tmp_path / "holds")
            )
    finally:
        server.stop()


async def _signed_urls_download_from(server: ServeProcess, client: httpx.AsyncClient) -> None:
    r = await client.get("/api/v1/resolve", params={"model": "acme/deployed"})
    assert r.status_code == 200, r.text
    body = r.json()
    weights = next(f for f in body["files"] if f["path"] == "model.tensors")
    assert weights["url"].startswith(f"{server.url}/api/v1/blobs/"), weights["url"]
    assert body["tensorizer_uri"].startswith(f"{server.url}/")
    stored = (
        server.data_dir / "storage" / "artifacts" / body["artifact"]["id"] / "model.tensors"
    ).read_bytes()
    async with httpx.AsyncClient() as node:  # no token: the URL carries the auth
        part = await node.get(weights["url"], headers={"Range": "bytes=0-99"})
        assert part.status_code == 206
        assert part.content == stored[:100]
        whole = await node.get(weights["url"])
        assert whole.status_code == 200
        assert hashlib.sha256(whole.content).hexdigest() == weights["sha256"]


async def _kill_the_worker_while_a_job_runs(
    server: ServeProcess, client: httpx.AsyncClient, model_id: str, hold: StageHold
) -> None:
    ready = await _wait_readyz(server, 200)
    assert ready["checks"]["worker"] == "ok"
    # The job stops at its first serialized bytes until the worker is killed there; the
    # restarted worker's attempt runs through (the hold is armed once).
    hold.arm()
    r = await client.post(
        f"/api/v1/models/{model_id}/tensorize", json={"dtype": "bfloat16", "format": "hf"}
    )
    assert r.status_code == 202, r.text
    await hold.wait_held(timeout=180)
    job = (await client.get(f"/api/v1/jobs/{r.json()['id']}")).json()
    assert job["status"] == "running", job
    node, _, _ = job["worker"].rpartition("/")
    os.kill(int(node.rsplit(":", 1)[1]), signal.SIGKILL)

    down = await _wait_readyz(server, 503)
    assert down["checks"]["worker"].startswith("down:"), down
    assert "signal 9" in down["checks"]["worker"]
    up = await _wait_readyz(server, 200)
    assert up["checks"]["worker"] == "ok"

    done = await wait_job(client, job["id"], timeout=240)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2
    assert not done["worker"].startswith(f"{node}/")
    assert any("embedded worker" in line and "restarting" in line for line in server.lines)
    artifact = (await client.get(f"/api/v1/artifacts/{done['artifact_id']}")).json()
    assert artifact["status"] == "ready"

    # serve itself killed: its worker (in a process group of its own) does not outlive it.
    new_pid = int(done["worker"].rpartition("/")[0].rsplit(":", 1)[1])
    assert _running(new_pid)
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    server.proc = None
    deadline = time.monotonic() + 60
    while _running(new_pid):
        assert time.monotonic() < deadline, "the worker outlived serve"
        await asyncio.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
