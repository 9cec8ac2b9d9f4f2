"""Property-based pass over the OpenAPI document (schemathesis): no input produces a 5xx."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.serve_process import ServeProcess, free_port

TOKEN = "trg_fuzz-admin-0123456789abcdefghijklmnop"


@pytest.mark.slow
def test_schemathesis_finds_no_server_errors(tmp_path: Path) -> None:
    binary = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert binary, "schemathesis is a dev dependency"
    server = ServeProcess(
        data_dir=tmp_path / "data", port=free_port(), env={"TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN}
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
                "not_a_server_error",
                "--max-examples",
                "12",
                "--generation-deterministic",
                "--request-timeout",
                "20",
                # Revoking tokens is fuzzed in its own tests; here it would revoke the very token
                # the run authenticates with (the stateful phase links GET /tokens/self → DELETE).
                "--exclude-name",
                "DELETE /api/v1/tokens/{token_id}",
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
    finally:
        server.stop()
