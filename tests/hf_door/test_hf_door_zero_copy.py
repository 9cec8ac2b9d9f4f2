"""The door's file route on the server's zero-copy protocol: a file's bytes never enter Python.

The app is called as ``tensor-registry serve``'s protocol calls it, with the zero-copy extension
in the scope (tensor_registry_server.blobs.zerocopy), and every message it sends is kept: the GET
of a stored file
must be one ``http.response.zerocopysend`` of exactly the file's (or the range's) bytes and no
``body`` carrying any, and HEAD must carry every header ``huggingface_hub``'s
``get_hf_file_metadata`` reads, so the client's GET is the only other request for the file.
bench/serving/hf_door.py measures the same route against nginx.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import httpx

from harness.artifacts import MadeArtifact, make_artifact
from harness.hf_bytes import tiny_safetensors
from tensor_registry_server.blobs.zerocopy import ZEROCOPY_SEND
from tensor_registry_server.settings import Settings
from tests.conftest import ADMIN_TOKEN

NAME = "hfdoor/zero-copy"
CONFIG = b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'


async def _variant(client: httpx.AsyncClient, settings: Settings) -> MadeArtifact:
    model = (await client.post("/api/v1/models", json={"name": NAME})).json()
    await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    for path, data in (("config.json", CONFIG), ("model.safetensors", tiny_safetensors())):
        r = await client.put(f"/api/v1/models/{model['id']}/versions/1/files/{path}", content=data)
        assert r.status_code == 201, r.text
    r = await client.post(f"/api/v1/models/{model['id']}/versions/1/finalize")
    assert r.status_code == 200, r.text
    return await make_artifact(settings, model=NAME, version=1, dtype="float32")


async def _call(
    app: Any,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    token: str = ADMIN_TOKEN,
) -> list[dict[str, Any]]:
    """The messages the app sends for one request on a server offering zero-copy sends; a
    zero-copy message is kept with the bytes its file holds at that offset, read when sent."""
    raw = [(b"authorization", f"Bearer {token}".encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *raw],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "extensions": {ZEROCOPY_SEND: {}},
        "state": {},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == ZEROCOPY_SEND:
            fd = message["file"].fileno()
            message = {**message, "bytes": os.pread(fd, message["count"], message["offset"])}
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _headers(start: dict[str, Any]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in start["headers"]}


async def test_get_sends_the_file_by_zero_copy_and_head_has_what_the_client_reads(
    app: Any, client: httpx.AsyncClient, settings: Settings
) -> None:
    made = await _variant(client, settings)
    weights = made.files["model.tensors"]
    assert len(weights) > 4096
    sha256 = hashlib.sha256(weights).hexdigest()
    path = f"/{NAME}/resolve/1.float32.hf.tp1/model.tensors"

    start, *body = await _call(app, "GET", path)
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = _headers(start)
    assert headers["content-length"] == str(len(weights))
    zero_copy = [m for m in body if m["type"] == ZEROCOPY_SEND]
    assert [(m["offset"], m["count"]) for m in zero_copy] == [(0, len(weights))]
    assert zero_copy[0]["bytes"] == weights
    # No byte of the file passes through a body message (only the empty closing one).
    assert [m.get("body", b"") for m in body if m["type"] == "http.response.body"] == [b""]

    start, *body = await _call(app, "GET", path, {"Range": "bytes=1000-4095"})
    assert start["status"] == 206
    assert _headers(start)["content-range"] == f"bytes 1000-4095/{len(weights)}"
    ranged = [m for m in body if m["type"] == ZEROCOPY_SEND]
    assert [(m["offset"], m["count"], m["bytes"]) for m in ranged] == [
        (1000, 3096, weights[1000:4096])
    ]

    # HEAD: what get_hf_file_metadata reads (commit, etag, size), and no bytes at all.
    start, *body = await _call(app, "HEAD", path)
    assert start["status"] == 200
    head = _headers(start)
    commit = head["x-repo-commit"]
    assert len(commit) == 40 and int(commit, 16) >= 0
    assert head["x-linked-etag"] == head["etag"] == f'"{sha256}"'
    assert head["x-linked-size"] == head["content-length"] == str(len(weights))
    assert "location" not in head
    assert [m["type"] for m in body] == ["http.response.body"] and body[0]["body"] == b""


async def test_a_foreign_token_gets_no_bytes_on_the_zero_copy_path(
    app: Any, client: httpx.AsyncClient, settings: Settings
) -> None:
    await _variant(client, settings)
    path = f"/{NAME}/resolve/1.float32.hf.tp1/model.tensors"
    for method in ("GET", "HEAD"):
        start, *body = await _call(app, method, path, token="trg_not-a-token-of-this-registry")
        assert start["status"] == 401
        assert not [m for m in body if m["type"] == ZEROCOPY_SEND]
