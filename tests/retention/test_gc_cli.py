"""`tensor-registry gc` with the settings serve uses: --dry-run lists and removes nothing,
--json is one document, and a real run removes what the dry run listed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from harness.serve_process import ROOT
from tensor_registry_server.settings import Settings
from tests.factories import create_model, ready_version


def _gc(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    env = {**clean, "TENSOR_REGISTRY_DATABASE__URL": settings.database_url}
    return subprocess.run(
        [sys.executable, "-m", "tensor_registry.cli", "gc", "--data-dir", str(settings.data_dir),
         *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


async def test_gc_dry_run_lists_then_gc_removes(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/cli")
    for _ in range(3):
        await ready_version(client, model["id"])
    r = await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})
    assert r.status_code == 201
    assert (await client.put("/api/v1/namespaces/acme/retention", json={"keep_last": 1})).is_success

    dry = _gc(settings, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dry_run"] is True
    assert [(d["model"], d["version"]) for d in report["would_remove"]] == [("acme/cli", 2)]
    kept = {d["version"]: d["reasons"] for d in report["kept"]}
    assert kept[1][0] == "alias 'prod' points at it"
    assert "among the newest 1" in kept[3][0]
    assert (await client.get(f"/api/v1/models/{model['id']}/versions/2")).status_code == 200

    text = _gc(settings, "--dry-run")
    assert text.returncode == 0, text.stderr
    assert "would remove acme/cli v2" in text.stdout
    assert "keep acme/cli v1: alias 'prod' points at it" in text.stdout

    done = _gc(settings)
    assert done.returncode == 0, done.stderr
    assert "removed acme/cli v2" in done.stdout
    assert (await client.get(f"/api/v1/models/{model['id']}/versions/2")).status_code == 404
    assert (await client.get(f"/api/v1/models/{model['id']}/versions/1")).status_code == 200
