"""A real `serve`: X-Forwarded-For from a loopback peer is not believed unless that peer is a
configured proxy (uvicorn's own default trusts every 127.0.0.1 peer)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from harness.serve_process import ServeProcess, free_port


def _logged_client(server: ServeProcess, request_id: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in list(server.lines):
            if request_id in line and '"event": "request"' in line:
                return str(json.loads(line)["client"])
        time.sleep(0.05)
    raise AssertionError(f"no access log line for {request_id}:\n" + "".join(server.lines[-20:]))


@pytest.mark.parametrize(
    ("trusted", "expected"), [(None, "127.0.0.1"), ('["127.0.0.1"]', "203.0.113.9")]
)
def test_serve_believes_x_forwarded_for_only_from_configured_proxies(
    tmp_path: Path, trusted: str | None, expected: str
) -> None:
    env = {"TENSOR_REGISTRY_LOG_LEVEL": "INFO"}
    if trusted is not None:
        env["TENSOR_REGISTRY_SECURITY__TRUSTED_PROXIES"] = trusted
    server = ServeProcess(data_dir=tmp_path / "data", port=free_port(), env=env).start()
    try:
        request_id = "forwarded-test-0001"
        r = httpx.get(
            f"{server.url}/healthz",
            headers={"X-Forwarded-For": "203.0.113.9", "X-Request-Id": request_id},
        )
        assert r.status_code == 200
        assert _logged_client(server, request_id) == expected
    finally:
        server.stop()
