"""Finalize refuses pickle-based weights, by name and by content, with a problem+json that
names the files and the way out (the convert route); nothing of the draft is lost."""

from __future__ import annotations

import io
import json
import pickle
import zipfile

import httpx
import torch

from harness.hf_bytes import tiny_safetensors
from tests.factories import create_model, upload

CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()


def torch_zip() -> bytes:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    return buffer.getvalue()


def legacy_torch() -> bytes:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


async def _draft(client: httpx.AsyncClient, files: dict[str, bytes]) -> tuple[str, int]:
    model = await create_model(client, name="acme/pickled")
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    number = r.json()["version"]
    for path, data in {"config.json": CONFIG, **files}.items():
        assert (await upload(client, model["id"], number, path, data)).status_code == 201
    return model["id"], number


async def test_a_folder_of_bin_weights_is_refused_with_the_files_and_the_way_out(
    client: httpx.AsyncClient,
) -> None:
    model_id, number = await _draft(
        client,
        {
            "pytorch_model-00001-of-00002.bin": torch_zip(),
            "pytorch_model-00002-of-00002.bin": legacy_torch(),
        },
    )
    r = await client.post(f"/api/v1/models/{model_id}/versions/{number}/finalize")
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["code"] == "pickle_refused"
    assert sorted(f["path"] for f in body["files"]) == [
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
    ]
    assert body["convert"] == f"/api/v1/models/{model_id}/versions/{number}/convert"
    assert "pytorch_model-00001-of-00002.bin" in body["detail"] and "convert" in body["detail"]
    # The draft and its files stay as they were.
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "draft" and len(version["files"]) == 3


async def test_pickles_are_found_by_content_whatever_their_name(client: httpx.AsyncClient) -> None:
    model_id, number = await _draft(
        client,
        {
            "model.safetensors": tiny_safetensors(),
            "weights.dat": torch_zip(),  # torch.save's zip, renamed
            "extra/state": pickle.dumps({"a": 1}, protocol=4),  # a raw pickle
            "tokenizer.model": b"\x0a\x05hello",  # not a pickle
            "notes.zip": _plain_zip(),  # a zip without pickles
        },
    )
    r = await client.post(f"/api/v1/models/{model_id}/versions/{number}/finalize")
    assert r.status_code == 422, r.text
    files = {f["path"]: f["reason"] for f in r.json()["files"]}
    assert set(files) == {"weights.dat", "extra/state"}
    assert "data.pkl" in files["weights.dat"] and "protocol 4" in files["extra/state"]


async def test_safetensors_only_folders_still_finalize(client: httpx.AsyncClient) -> None:
    model_id, number = await _draft(client, {"model.safetensors": tiny_safetensors()})
    r = await client.post(f"/api/v1/models/{model_id}/versions/{number}/finalize")
    assert r.status_code == 200, r.text


def _plain_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("readme.txt", "hello")
    return buffer.getvalue()


async def test_custom_code_is_flagged_on_the_version(client: httpx.AsyncClient) -> None:
    config = {
        "architectures": ["FancyForCausalLM"],
        "model_type": "fancy",
        "auto_map": {"AutoModelForCausalLM": "modeling_fancy.FancyForCausalLM"},
    }
    model = await create_model(client, name="acme/fancy")
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    for path, data in (
        ("config.json", json.dumps(config).encode()),
        ("model.safetensors", tiny_safetensors()),
        ("modeling_fancy.py", b"import os\n"),
    ):
        assert (await upload(client, model["id"], 1, path, data)).status_code == 201
    r = await client.post(f"/api/v1/models/{model['id']}/versions/1/finalize")
    assert r.status_code == 200, r.text
    assert r.json()["remote_code"] == {
        "auto_map": {"AutoModelForCausalLM": "modeling_fancy.FancyForCausalLM"},
        "files": ["modeling_fancy.py"],
    }
    plain_id, number = await _draft(client, {"model.safetensors": tiny_safetensors()})
    r = await client.post(f"/api/v1/models/{plain_id}/versions/{number}/finalize")
    assert r.status_code == 200 and r.json()["remote_code"] is None
