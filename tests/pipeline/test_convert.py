"""Pickle-based weights → safetensors through a real worker: finalize refuses the .bin folder,
POST …/convert makes a new version whose safetensors hold the same tensors and which finalize's
checks made ready; a malicious .bin fails the job, writes nothing and leaves the version failed."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import load

from harness.waiting import wait_job
from tests.factories import create_model, upload

CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.code = f"open({str(marker)!r}, 'w').write('pwned')"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (self.code,))


def _saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


async def _refused_draft(client: httpx.AsyncClient, name: str, weights: bytes) -> tuple[str, int]:
    model = await create_model(client, name=name)
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    number = r.json()["version"]
    for path, data in (("config.json", CONFIG), ("pytorch_model.bin", weights)):
        assert (await upload(client, model["id"], number, path, data)).status_code == 201
    r = await client.post(f"/api/v1/models/{model['id']}/versions/{number}/finalize")
    assert r.status_code == 422 and r.json()["code"] == "pickle_refused"
    return model["id"], number


async def test_convert_publishes_equal_safetensors_as_a_new_ready_version(
    client: httpx.AsyncClient, live_worker: dict[str, Any]
) -> None:
    state = {"model.embed.weight": torch.randn(4, 8), "lm_head.bias": torch.zeros(4)}
    model_id, number = await _refused_draft(client, "acme/convert", _saved(state))
    r = await client.post(f"/api/v1/models/{model_id}/versions/{number}/convert")
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "importing" and r.json()["version"] == number + 1
    job = await wait_job(client, r.headers["location"].rsplit("/", 1)[1])
    assert job["status"] == "succeeded", job
    assert job["kind"] == "convert"
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number + 1}")).json()
    assert version["status"] == "ready"
    assert sorted(f["path"] for f in version["files"]) == ["config.json", "model.safetensors"]
    url = f"/api/v1/models/{model_id}/versions/{number + 1}/files/model.safetensors"
    r = await client.get(url)
    assert r.status_code == 200, r.text
    converted = load(r.content)
    assert set(converted) == set(state)
    for name, tensor in state.items():
        assert torch.equal(converted[name], tensor)


async def test_a_malicious_bin_fails_the_job_and_runs_nothing(
    client: httpx.AsyncClient, live_worker: dict[str, Any], tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    weights = _saved({"w": torch.ones(2), "evil": _Payload(marker)})
    model_id, number = await _refused_draft(client, "acme/evil", weights)
    r = await client.post(f"/api/v1/models/{model_id}/versions/{number}/convert")
    assert r.status_code == 202, r.text
    job = await wait_job(client, r.headers["location"].rsplit("/", 1)[1])
    assert job["status"] == "failed" and job["error"]["code"] == "conversion_failed"
    assert not marker.exists()
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number + 1}")).json()
    assert version["status"] == "failed" and version["files"] == []


async def test_a_version_without_pickles_has_nothing_to_convert(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/clean")
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    await upload(client, model["id"], 1, "config.json", CONFIG)
    r = await client.post(f"/api/v1/models/{model['id']}/versions/1/convert")
    assert r.status_code == 409 and r.json()["code"] == "nothing_to_convert"
