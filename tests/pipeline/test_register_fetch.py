"""Registering from http(s):// goes through the guarded fetcher in the real worker process.

The worker (and the API) allow-list only the name ``localhost`` (tests/pipeline/conftest.py),
so the helper server on 127.0.0.1 is reachable as ``localhost`` and refused under every literal
spelling; ``remote.requests`` shows what the worker connected to.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from harness.waiting import wait_job
from tensor_registry_server.settings import Settings
from tests.hf_fixtures import make_tiny_llama
from tests.pipeline.helpers import artifact_dir, get_artifact, publish_dir
from tests.pipeline.test_register import _write_external
from tests.remote import RemoteServer, remote_server, without_urls

BODY = {"version": 1, "dtype": "float16", "format": "hf"}


@pytest.fixture
def remote() -> Iterator[RemoteServer]:
    with remote_server() as server:
        yield server


@pytest.fixture(scope="module")
def tensors(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A tiny Llama checkpoint and its float16 tensorizer file."""
    base = tmp_path_factory.mktemp("fetch-src")
    src = make_tiny_llama(base / "src")
    out = _write_external(src, base / "ext", dtype=torch.float16, companions=False)
    return src, (out / "model.tensors").read_bytes()


async def _model(api: httpx.AsyncClient, src: Path) -> str:
    model_id, _ = await publish_dir(api, src, name=f"acme/fetch-{uuid.uuid4().hex[:8]}")
    return model_id


async def _register(api: httpx.AsyncClient, model_id: str, uri: str) -> dict[str, object]:
    r = await api.post(f"/api/v1/models/{model_id}/artifacts", json={**BODY, "uri": uri})
    assert r.status_code == 202, r.text
    return await wait_job(api, r.json()["id"])


async def test_register_refuses_internal_uris_up_front(
    api: httpx.AsyncClient, remote: RemoteServer, tensors: tuple[Path, bytes], embedded_only: None
) -> None:
    model_id = await _model(api, tensors[0])
    port = remote.port
    for uri in (
        f"http://127.0.0.1:{port}/model.tensors",
        f"https://127.0.0.1:{port}/model.tensors",
        f"http://0x7f000001:{port}/model.tensors",
        f"http://2130706433:{port}/model.tensors",
        f"http://[::ffff:127.0.0.1]:{port}/model.tensors",
        f"http://[::ffff:7f00:1]:{port}/model.tensors",
        "https://169.254.169.254/latest/model.tensors",
        "https://10.0.0.1/model.tensors",
        "https://[fd00::1]/model.tensors",
        "s3://some-bucket/model.tensors",
        "s3://tensor-registry/artifacts/model.tensors",  # the registry's own bucket
    ):
        r = await api.post(f"/api/v1/models/{model_id}/artifacts", json={**BODY, "uri": uri})
        assert r.status_code == 422, (uri, r.text)
        assert r.json()["code"] == "source_refused", (uri, r.json())
    assert (await api.get(f"/api/v1/models/{model_id}/artifacts")).json()["items"] == []
    assert remote.requests == []


async def test_register_over_http_fetches_verifies_and_never_shows_credentials(
    api: httpx.AsyncClient,
    settings: Settings,
    remote: RemoteServer,
    tensors: tuple[Path, bytes],
    embedded_only: None,
) -> None:
    src, data = tensors
    remote.add("/w/model.tensors", data)
    model_id = await _model(api, src)
    uri = remote.url("/w/model.tensors", host="user:password@localhost")
    done = await _register(api, model_id, uri + "?X-Amz-Signature=deadbeef")
    assert done["status"] == "succeeded", done["error"]
    artifact = await get_artifact(api, str(done["artifact_id"]))
    assert (artifact_dir(settings, artifact["id"]) / "model.tensors").read_bytes() == data
    assert [p for p, _ in remote.requests] == ["/w/model.tensors?X-Amz-Signature=deadbeef"]
    shown = remote.url("/w/model.tensors", host="localhost")
    assert artifact["source_uri"] == shown and done["params"]["uri"] == shown
    audit = (await api.get("/api/v1/audit", params={"limit": 500})).text
    for text in (str(artifact), str(done), audit):
        assert "password" not in text and "X-Amz-Signature" not in text and "deadbeef" not in text


async def test_a_redirect_to_an_internal_address_fails_the_verify_job(
    api: httpx.AsyncClient, remote: RemoteServer, tensors: tuple[Path, bytes], embedded_only: None
) -> None:
    src, data = tensors
    remote.add("/secret.tensors", data)
    remote.redirect("/model.tensors", remote.url("/secret.tensors"))
    model_id = await _model(api, src)
    done = await _register(api, model_id, remote.url("/model.tensors", host="localhost"))
    assert done["status"] == "failed"
    assert done["error"]["code"] == "source_refused" and done["error"]["status"] == 422
    assert [p for p, _ in remote.requests] == ["/model.tensors"]


@pytest.mark.parametrize(
    ("route", "code"),
    [
        ("endless", "source_too_large"),
        ("not-tensorizer", "source_unexpected_content"),
        ("unauthorized", "source_unreachable"),
    ],
)
async def test_hostile_sources_fail_the_verify_job_with_a_4xx_code(
    api: httpx.AsyncClient,
    remote: RemoteServer,
    tensors: tuple[Path, bytes],
    route: str,
    code: str,
    embedded_only: None,
) -> None:
    remote.stream("/endless/model.tensors", b"\0" * 65536, head=b"|TZR|")
    remote.stream("/not-tensorizer/model.tensors", b"<html>" * 1000)
    remote.add("/unauthorized/model.tensors", b"admin console", status=401)
    model_id = await _model(api, tensors[0])
    done = await _register(api, model_id, remote.url(f"/{route}/model.tensors", host="localhost"))
    assert done["status"] == "failed"
    error = done["error"]
    assert error["code"] == code and 400 <= error["status"] < 500, error
    for leak in ("401", "HTTP", "Error", "admin"):
        assert leak not in without_urls(error["detail"]), error
