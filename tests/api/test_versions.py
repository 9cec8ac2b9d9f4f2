"""Versions: drafts, uploads (streamed, hashed, checked), finalize, frozen versions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from harness.hf_bytes import tiny_safetensors
from tensor_registry_server.settings import Settings
from tests.factories import create_model, ready_version, upload


async def _draft(client: httpx.AsyncClient) -> tuple[str, int]:
    model = await create_model(client, name="acme/llama")
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    assert r.status_code == 201
    assert r.json()["status"] == "draft" and r.json()["version"] == 1
    return model["id"], 1


def _stored_files(settings: Settings) -> list[Path]:
    root = settings.local_storage_root
    return sorted(p for p in root.rglob("*") if p.is_file() and ".tmp" not in p.parts)


async def test_upload_stores_exact_bytes_with_sha256(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model_id, n = await _draft(client)
    data = bytes(range(256)) * 4096
    r = await upload(client, model_id, n, "model.safetensors", data)
    assert r.status_code == 201
    assert r.json() == {
        "path": "model.safetensors",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    [stored] = _stored_files(settings)
    assert stored.read_bytes() == data
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{n}")).json()
    assert version["files"] == [r.json()]


async def test_reupload_replaces_the_file_and_its_bytes(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model_id, n = await _draft(client)
    await upload(client, model_id, n, "config.json", b'{"a": 1}')
    r = await upload(client, model_id, n, "config.json", b'{"a": 2}')
    assert r.status_code == 201
    files = _stored_files(settings)
    assert [f.read_bytes() for f in files] == [b'{"a": 2}']


async def test_sha256_mismatch_is_refused_and_nothing_is_kept(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model_id, n = await _draft(client)
    r = await upload(
        client, model_id, n, "model.safetensors", b"abc", **{"X-Content-SHA256": "0" * 64}
    )
    assert r.status_code == 422
    assert r.json()["code"] == "checksum_mismatch"
    assert r.json()["actual"] == hashlib.sha256(b"abc").hexdigest()
    assert _stored_files(settings) == []
    assert not list((settings.local_storage_root / ".tmp").iterdir())
    assert (await client.get(f"/api/v1/models/{model_id}/versions/{n}")).json()["files"] == []
    good = await upload(
        client,
        model_id,
        n,
        "model.safetensors",
        b"abc",
        **{"X-Content-SHA256": hashlib.sha256(b"abc").hexdigest()},
    )
    assert good.status_code == 201


@pytest.mark.parametrize(
    "path",
    # httpx resolves literal '..' client-side, so traversal arrives percent-encoded, which the
    # server decodes before routing: the form an attacker would use too.
    [
        "%2e%2e/etc/passwd",
        "a%2F..%2F..%2Fb",
        ".%2Fconfig.json",
        "a//b",
        "sub/.hidden/x",
        "evil%00.json",
        "x%2F..%2F..%2Fy",
        "dir/",
        "%2Fetc%2Fpasswd",
        "name with space",
    ],
)
async def test_path_traversal_is_refused(
    client: httpx.AsyncClient, settings: Settings, path: str
) -> None:
    model_id, n = await _draft(client)
    r = await upload(client, model_id, n, path, b"x")
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid_path"
    assert _stored_files(settings) == []


async def test_absolute_path_via_double_slash_is_refused(client: httpx.AsyncClient) -> None:
    model_id, n = await _draft(client)
    r = await client.put(f"/api/v1/models/{model_id}/versions/{n}/files//etc/passwd", content=b"x")
    assert r.status_code == 422 and r.json()["code"] == "invalid_path"


async def test_upload_needs_content_length(client: httpx.AsyncClient) -> None:
    model_id, n = await _draft(client)

    async def body():  # chunked: no Content-Length
        yield b"abc"

    r = await client.put(
        f"/api/v1/models/{model_id}/versions/{n}/files/config.json", content=body()
    )
    assert r.status_code == 411 and r.json()["code"] == "length_required"


async def test_upload_over_the_limit_is_413(client: httpx.AsyncClient, settings: Settings) -> None:
    settings.storage.max_upload_bytes = 10
    model_id, n = await _draft(client)
    r = await upload(client, model_id, n, "model.safetensors", b"x" * 11)
    assert r.status_code == 413
    assert _stored_files(settings) == []


async def test_finalize_validates_and_freezes(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/llama")
    version = await ready_version(client, model["id"])
    assert version["status"] == "ready" and version["finalized_at"]
    r = await upload(client, model["id"], version["version"], "extra.json", b"{}")
    assert r.status_code == 409 and r.json()["code"] == "version_frozen"
    d = await client.delete(
        f"/api/v1/models/{model['id']}/versions/{version['version']}/files/config.json"
    )
    assert d.status_code == 409 and d.json()["code"] == "version_frozen"


def _two_dtype_safetensors() -> bytes:
    """Two F32 tensors (2x3 and 4) and one BF16 tensor (5): 10 + 5 parameters."""
    tensors = [("a", "F32", [2, 3], 4), ("b", "F32", [4], 4), ("c", "BF16", [5], 2)]
    header: dict[str, object] = {}
    offset = 0
    for name, dtype, shape, width in tensors:
        size = width
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + bytes(offset)


async def test_finalize_keeps_architecture_parameter_count_and_dtype_breakdown(
    client: httpx.AsyncClient,
) -> None:
    model_id, n = await _draft(client)
    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    await upload(client, model_id, n, "config.json", json.dumps(config).encode())
    await upload(client, model_id, n, "model.safetensors", _two_dtype_safetensors())
    draft = (await client.get(f"/api/v1/models/{model_id}/versions/{n}")).json()
    assert draft["parameter_count"] is None and draft["dtype_breakdown"] is None

    r = await client.post(f"/api/v1/models/{model_id}/versions/{n}/finalize")
    assert r.status_code == 200, r.text
    for body in (r.json(), (await client.get(f"/api/v1/models/{model_id}/versions/{n}")).json()):
        assert body["architecture"] == "MistralForCausalLM"
        assert body["parameter_count"] == 15
        assert body["dtype_breakdown"] == {
            "F32": {"tensors": 2, "parameters": 10, "bytes": 40},
            "BF16": {"tensors": 1, "parameters": 5, "bytes": 10},
        }
    listed = (await client.get(f"/api/v1/models/{model_id}/versions")).json()["items"]
    assert listed[0]["parameter_count"] == 15


async def test_finalize_reports_problems_per_file(client: httpx.AsyncClient) -> None:
    model_id, n = await _draft(client)
    await upload(client, model_id, n, "config.json", b"{not json")
    good = tiny_safetensors()
    await upload(client, model_id, n, "a.safetensors", good)
    await upload(client, model_id, n, "b.safetensors", good[:-4])  # truncated
    r = await client.post(f"/api/v1/models/{model_id}/versions/{n}/finalize")
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "invalid_version"
    problems = {(p["path"], p["code"]) for p in body["problems"]}
    assert problems == {("config.json", "invalid_config"), ("b.safetensors", "corrupt_weights")}
    assert (await client.get(f"/api/v1/models/{model_id}/versions/{n}")).json()["status"] == "draft"


async def test_finalize_needs_weights(client: httpx.AsyncClient) -> None:
    model_id, n = await _draft(client)
    await upload(client, model_id, n, "config.json", json.dumps({"model_type": "gpt2"}).encode())
    r = await client.post(f"/api/v1/models/{model_id}/versions/{n}/finalize")
    assert r.status_code == 422
    assert [p["code"] for p in r.json()["problems"]] == ["missing_weights"]


async def test_versions_are_numbered_per_model(client: httpx.AsyncClient) -> None:
    a = await create_model(client, name="acme/a")
    b = await create_model(client, name="acme/b")
    numbers = []
    for model in (a, a, b, a):
        r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
        numbers.append(r.json()["version"])
    assert numbers == [1, 2, 1, 3]
    listing = (await client.get(f"/api/v1/models/{a['id']}/versions", params={"limit": 2})).json()
    assert [v["version"] for v in listing["items"]] == [1, 2] and listing["next_cursor"]


async def test_delete_version_removes_its_bytes(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/llama")
    version = await ready_version(client, model["id"])
    assert _stored_files(settings)
    r = await client.delete(f"/api/v1/models/{model['id']}/versions/{version['version']}")
    assert r.status_code == 204
    assert _stored_files(settings) == []


async def test_file_import_outside_allowed_roots_is_refused(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/llama")
    r = await client.post(
        f"/api/v1/models/{model['id']}/versions", json={"source_uri": "file:///etc/"}
    )
    assert r.status_code == 422 and r.json()["code"] == "import_root_forbidden"
    r = await client.post(
        f"/api/v1/models/{model['id']}/versions", json={"source_uri": "ftp://x/y"}
    )
    assert r.status_code == 422 and r.json()["code"] == "invalid_source_uri"


async def test_a_version_file_downloads_as_an_attachment_the_browser_never_renders(
    client: httpx.AsyncClient,
) -> None:
    model_id, n = await _draft(client)
    card = b"# Card\n<script>alert(1)</script>\n"
    await upload(client, model_id, n, "README.md", card)
    r = await client.get(f"/api/v1/models/{model_id}/versions/{n}/files/README.md")
    assert r.status_code == 200 and r.content == card
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"] == "attachment"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["etag"] == f'"{hashlib.sha256(card).hexdigest()}"'
    assert int(r.headers["content-length"]) == len(card)
    missing = await client.get(f"/api/v1/models/{model_id}/versions/{n}/files/nope.md")
    assert missing.status_code == 404 and missing.json()["code"] == "file_not_found"
    other = await client.get(f"/api/v1/models/{model_id}/versions/9/files/README.md")
    assert other.status_code == 404 and other.json()["code"] == "version_not_found"
    unauth = await client.get(
        f"/api/v1/models/{model_id}/versions/{n}/files/README.md", headers={"Authorization": ""}
    )
    assert unauth.status_code == 401
