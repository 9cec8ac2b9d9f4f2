"""Issue 26 §4: importing a bundle checks every file against its signed manifest, not only the
weights: an edited config.json fails the import at the CLI and, registered straight through the
API (no client-side check), in the importing registry's worker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from harness.waiting import wait_job_sync
from tensor_registry.formats.model_signature import KEYS_FILE
from tests.client.conftest import Registry
from tests.client.test_trust import (  # noqa: F401 - fixtures: the second registry, its roots
    _state,
    client_config,
    imports,
    second,
    signed_artifact,
)


async def test_a_bundle_with_an_edited_config_is_not_imported(
    registry: Registry,
    second: Registry,  # noqa: F811 - the fixture imported above
    imports: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    state = {"weight": torch.arange(16, dtype=torch.float32), **_state(21)}
    name, _ = await signed_artifact(registry, state=state)
    env = {
        "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"),
        "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    bundle = imports / "bundle-config"
    exported = registry.cli("export", f"{name}:1", "--to", str(bundle), env=env)
    assert exported.returncode == 0, exported.stderr
    target = second.ready_model(name)

    edited = imports / "edited-config"
    shutil.copytree(bundle, edited)
    config = edited / "config.json"
    original = config.read_bytes()
    changed = json.dumps({**json.loads(original), "trust_remote_code": True}).encode()
    config.unlink()
    config.write_bytes(changed)
    # The bundle's keys.json is the exporter's: given here as the out-of-band trusted key.
    keys = str(bundle / KEYS_FILE)

    refused = second.cli("import", str(edited), "--model", name, "--trusted-key", keys, env=env)
    assert refused.returncode == 1 and "content_mismatch" in refused.stderr, refused.stderr
    assert "config.json" in refused.stderr

    with second.http() as http:
        r = http.post(
            f"/api/v1/models/{target['id']}/artifacts",
            json={"version": 1, "dtype": "float32", "format": "hf", "uri": edited.as_uri() + "/"},
        )
        assert r.status_code == 202, r.text
        job = wait_job_sync(http, r.json()["id"], timeout=300)
        assert job["status"] == "failed", job
        assert job["error"]["code"] == "content_mismatch", job
        assert "config.json" in json.dumps(job["error"]), job
        ready = http.get(
            f"/api/v1/models/{target['id']}/artifacts", params={"status": "ready"}
        ).json()
        assert ready["items"] == []
