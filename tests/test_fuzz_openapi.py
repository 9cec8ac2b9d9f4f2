"""Property-based pass over the OpenAPI document (schemathesis): no input produces a 5xx, and
every answer's status code and content type are ones the document declares for that route."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.serve_process import ServeProcess, free_port

TOKEN = "trg_fuzz-admin-0123456789abcdefghijklmnop"


@pytest.mark.slow
def test_schemathesis_finds_no_server_errors_and_only_documented_answers(
    tmp_path: Path,
) -> None:
    binary = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert binary, "schemathesis is a dev dependency"
    server = ServeProcess(
        data_dir=tmp_path / "data",
        port=free_port(),
        # No webhook deliveries: a generated webhook URL must never be fetched (loopback only).
        env={"TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN, "TENSOR_REGISTRY_WEBHOOKS__DELIVER": "false"},
    ).start()
    try:
        # Seed data so path parameters can hit existing rows in the stateful phase.
        h = {"Authorization": f"Bearer {TOKEN}"}
        model = httpx.post(
            f"{server.url}/api/v1/models", json={"name": "fuzz/seed"}, headers=h
        ).json()
        httpx.post(f"{server.url}/api/v1/models/{model['id']}/versions", json={}, headers=h)
        result = subprocess.run(
            [
                binary,
                "run",
                f"{server.url}/openapi.json",
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance",
                "--max-examples",
                "12",
                "--generation-deterministic",
                "--request-timeout",
                "20",
                # Revoking tokens is fuzzed in its own tests; here it would revoke the very token
                # the run authenticates with (the stateful phase links GET /tokens/self → DELETE).
                "--exclude-name",
                "DELETE /api/v1/tokens/{token_id}",
                # The events stream never ends by design (tests/api/test_events.py covers it).
                "--exclude-name",
                "GET /api/v1/events",
                "-H",
                f"Authorization: Bearer {TOKEN}",
            ],
            capture_output=True,
            text=True,
            timeout=420,
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        # It really exercised the API: every selected operation was tested.
        selected = re.search(r"Selected: (\d+)/(\d+)", result.stdout)
        tested = re.search(r"Tested: (\d+)", result.stdout)
        assert selected and tested, result.stdout[-3000:]
        assert int(tested.group(1)) == int(selected.group(1)) >= 20
        assert not any("Traceback" in line for line in server.lines), "\n".join(server.lines[-80:])

        # A request the HTTP parser rejects is answered with problem+json too (schemathesis
        # found uvicorn's text/plain 400 for `Content-Length: null`).
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"PUT /api/v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: null\r\n\r\n")
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), raw
        assert b"content-type: application/problem+json" in head.lower()
        assert json.loads(body)["code"] == "bad_request"
    finally:
        server.stop()
