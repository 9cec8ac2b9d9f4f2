"""One log format: every line a real `serve` prints, its embedded Celery worker included, is a
JSON object (no Celery banner, no plain-text task or shutdown lines, no bare warnings), but for
the bootstrap token's own line to paste."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from harness.serve_process import ServeProcess, free_port
from harness.waiting import poll, wait_job_sync, wait_live_worker_sync
from tests.hf_fixtures import make_tiny_llama

# The one line that is not a log line: the token to paste, on its own (stdout), first start only.
PASTE = "export TENSOR_REGISTRY_TOKEN="


def _parsed(lines: list[str]) -> list[dict[str, Any]]:
    entries = []
    pasted = [line for line in lines if line.startswith(PASTE)]
    assert len(pasted) == 1, pasted
    for number, line in enumerate(lines):
        if line.startswith(PASTE):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {number} is not JSON: {line!r}") from None
        assert isinstance(entry, dict), line
        assert {"ts", "level", "logger"} <= set(entry), line
        entries.append(entry)
    return entries


def _tail(server: ServeProcess) -> Callable[[], str]:
    return lambda: "".join(server.lines[-40:])


def test_every_line_of_serve_with_its_worker_is_json(tmp_path: Path) -> None:
    server = ServeProcess(data_dir=tmp_path / "data", port=free_port(), worker=True).start()
    try:
        token_line = poll(
            lambda: next((x for x in list(server.lines) if x.startswith(PASTE)), None),
            what="the bootstrap token line",
            timeout=180,
            detail=_tail(server),
        )
        api = httpx.Client(
            base_url=f"{server.url}/api/v1",
            headers={"Authorization": f"Bearer {token_line.strip().removeprefix(PASTE)}"},
            timeout=30,
        )
        model_id = api.post("/models", json={"name": "acme/logs"}).json()["id"]
        version = api.post(f"/models/{model_id}/versions", json={}).json()["version"]
        for path in sorted(make_tiny_llama(tmp_path / "tiny").iterdir()):
            r = api.put(
                f"/models/{model_id}/versions/{version}/files/{path.name}",
                content=path.read_bytes(),
                headers={"Content-Type": "application/octet-stream"},
            )
            assert r.status_code == 201, r.text
        assert api.post(f"/models/{model_id}/versions/{version}/finalize").status_code == 200
        wait_live_worker_sync(api, timeout=180, detail=_tail(server))
        job = api.post(f"/models/{model_id}/tensorize", json={"dtype": "float16"})
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        final = wait_job_sync(api, job_id, timeout=180, detail=_tail(server))
        assert final["status"] == "succeeded", final
        assert api.get("/models/00000000-0000-4000-8000-000000000000").status_code == 404
        api.close()
    finally:
        server.stop()
    entries = _parsed([line.rstrip("\n") for line in server.lines if line.strip()])
    assert not [line for line in server.lines if not line.strip()], "blank lines printed"
    loggers = {e["logger"] for e in entries}
    # The worker's own lines came through the same format: Celery's task lines, the access log,
    # uvicorn's, and the shutdown notice Celery writes past logging.
    assert {"tensor_registry.access", "uvicorn.error", "celery.app.trace"} <= loggers, loggers
    # Celery's task lines name its own task id; the task name and outcome are what we check.
    task_lines = [str(e.get("message")) for e in entries if e["logger"] == "celery.app.trace"]
    assert any("artifacts.tensorize" in m and "succeeded" in m for m in task_lines), task_lines
    assert any("Warm shutdown" in str(e.get("message")) for e in entries)
    assert not any("-------------- " in line for line in server.lines), "Celery banner printed"
