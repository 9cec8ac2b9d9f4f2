"""The importing registry refuses a bundle signed by a key it retired (docs/trust.md, "Keys and
rotation"): the node side drops retired keys from its pins, and the server's own check of an
imported bundle's signature does the same, whenever the bundle was signed. Real `serve`
restarts with a worker, the real `tensor-registry import` and the register route."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

from harness.serve_process import free_port
from harness.waiting import wait_job_sync
from tensor_registry.formats.model_signature import KEYS_FILE
from tensor_registry_server.settings import Settings
from tensor_registry_server.trust.signing_keys import manifest_keys, public_key_b64
from tests.client.conftest import Registry
from tests.client.test_trust import _state, signed_artifact
from tests.client.test_trust_rotation import _seed, _serving


async def test_a_bundle_signed_by_a_key_this_registry_retired_is_refused_on_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(tmp_path / "client-config"))
    monkeypatch.delenv("TENSOR_REGISTRY_TRUSTED_KEYS", raising=False)
    imports = tmp_path / "imports"
    imports.mkdir()
    data_dir, port = tmp_path / "data", free_port()
    env = {
        "TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS": json.dumps([str(imports)]),
        "TENSOR_REGISTRY_WORKER__HEARTBEAT_SECONDS": "1",
    }
    cli_env: dict[str, str | None] = {
        "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"),
        "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    old, new = _seed(), _seed()
    old_id = manifest_keys(Settings(security={"manifest_signing_key": old})).active_id  # type: ignore[arg-type]
    # The tensor of ready_model's source checkpoint too: the importing worker checks names.
    state = {"weight": torch.arange(16, dtype=torch.float32), **_state(5)}
    bundle = imports / "bundle"

    def import_into(registry: Registry, name: str) -> tuple[int, str]:
        registry.ready_model(name)
        done = registry.cli(
            "import",
            str(bundle),
            *("--model", name, "--trusted-key", str(bundle / KEYS_FILE)),
            env=cli_env,
            timeout=300,
        )
        return done.returncode, done.stderr

    with _serving(data_dir, port, {"manifest_signing_key": old}, worker=True, env=env) as registry:
        source, _ = await signed_artifact(registry, state=state)
        exported = registry.cli("export", f"{source}:1", "--to", str(bundle), env=cli_env)
        assert exported.returncode == 0, exported.stderr
        # Signed by its own active key: imported.
        code, err = import_into(registry, f"acme/before-{uuid.uuid4().hex[:8]}")
        assert code == 0, err

    rotated: dict[str, object] = {"manifest_signing_key": new, "manifest_previous_keys": [old]}
    with _serving(data_dir, port, rotated, worker=True, env=env) as registry:
        # A previous key still verifies: rotation alone refuses nothing.
        code, err = import_into(registry, f"acme/previous-{uuid.uuid4().hex[:8]}")
        assert code == 0, err

    retired: dict[str, object] = {
        "manifest_signing_key": new,
        "manifest_retired_public_keys": [public_key_b64(old)],
    }
    # Listing the retired key as a foreign registry's trusted key does not bring it back.
    also_foreign = {
        **env,
        "TENSOR_REGISTRY_SECURITY__TRUSTED_MANIFEST_KEYS": json.dumps([public_key_b64(old)]),
    }
    with _serving(data_dir, port, retired, worker=True, env=also_foreign) as registry:
        # The CLI trusts the bundle's keys.json (the old key was active then); the server does
        # not, and the import fails with the server's code.
        name = f"acme/after-{uuid.uuid4().hex[:8]}"
        code, err = import_into(registry, name)
        assert code == 1 and "retired_signing_key" in err, err
        with registry.http() as http:
            model_id = http.get("/api/v1/models", params={"q": name}).json()["items"][0]["id"]
            r = http.post(
                f"/api/v1/models/{model_id}/artifacts",
                json={
                    "version": 1,
                    "dtype": "float32",
                    "format": "hf",
                    "uri": bundle.as_uri() + "/",
                },
            )
            assert r.status_code == 202, r.text
            job = wait_job_sync(http, r.json()["id"], timeout=300)
            assert job["status"] == "failed", job
            assert job["error"]["code"] == "retired_signing_key", job
            assert old_id[:16] in job["error"]["detail"], job
            ready = http.get(
                f"/api/v1/models/{model_id}/artifacts", params={"status": "ready"}
            ).json()
            assert ready["items"] == []
