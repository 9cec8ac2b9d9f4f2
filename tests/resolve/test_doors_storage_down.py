"""The standard doors hand out no URLs into (and no bytes from) a store the registry found down,
as resolve does (tests/resolve/test_storage_down.py): a real `serve` whose S3 bucket goes away.
The Hugging Face door answers resolve's 503 ``storage_unavailable`` with the Hub's
``X-Error-Message``; the OCI door answers 503 with the distribution spec's body, code
``UNAVAILABLE``. The real clients (huggingface_hub, the oras SDK) raise and write no file."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import oras.client
import pytest
import requests

from harness.artifacts import MadeArtifact, make_artifact
from harness.hf_bytes import tiny_safetensors
from harness.serve_process import ServeProcess, free_port
from harness.waiting import poll
from tensor_registry_server.settings import Settings
from tests.hf_door.hf import run_hf
from tests.storage.conftest import S3_KEY_ID, S3_SECRET, make_bucket, s3_endpoint  # noqa: F401
from tests.storage.helpers import move_to_s3

TOKEN = "trg_doors-storage-down-0123456789abcdefghijklmnop"
NAME = "acme/bucketless"
VARIANT = "1.bfloat16.hf.tp1"
MANIFEST_ACCEPT = "application/vnd.oci.image.manifest.v1+json"
SOURCE = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}',
    "model.safetensors": tiny_safetensors(),
}


@dataclass
class Down:
    server: ServeProcess
    variant: MadeArtifact

    @property
    def host(self) -> str:
        return self.server.url.removeprefix("http://")

    def http(self) -> httpx.Client:
        return _http(self.server)


def _http(server: ServeProcess) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )


def _empty_and_delete(endpoint: str, bucket: str) -> None:
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_KEY_ID,
        aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
    )
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=item["Key"])
    s3.delete_bucket(Bucket=bucket)


@pytest.fixture(scope="module")
def down(
    tmp_path_factory: pytest.TempPathFactory,
    s3_endpoint: str,  # noqa: F811
) -> Iterator[Down]:
    """A model (version 1 and a bfloat16 variant) on S3, served until the bucket went away and
    /readyz has said so (the check resolve's guard remembers)."""
    bucket = make_bucket(s3_endpoint)
    data_dir = tmp_path_factory.mktemp("doors-down") / "data"
    server = ServeProcess(
        data_dir=data_dir,
        port=free_port(),
        env={
            "TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN,
            "TENSOR_REGISTRY_STORAGE__DEFAULT_BACKEND": "s3",
            "TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL": s3_endpoint,
            "TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID": S3_KEY_ID,
            "TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY": S3_SECRET,
            "TENSOR_REGISTRY_STORAGE__S3__BUCKET": bucket,
            # Retry-After 1 s: huggingface_hub waits it out before each of its 5 retries.
            "TENSOR_REGISTRY_STORAGE__RECHECK_SECONDS": "1",
        },
    ).start()
    try:
        with _http(server) as http:
            model = http.post("/api/v1/models", json={"name": NAME}).json()
            http.post(f"/api/v1/models/{model['id']}/versions", json={})
            for path, data in SOURCE.items():
                r = http.put(f"/api/v1/models/{model['id']}/versions/1/files/{path}", content=data)
                assert r.status_code == 201, r.text
            r = http.post(f"/api/v1/models/{model['id']}/versions/1/finalize")
            assert r.status_code == 200, r.text
        settings = Settings(
            data_dir=data_dir,
            database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
            storage={},  # type: ignore[arg-type]
            security={},  # type: ignore[arg-type]
        )
        variant = asyncio.run(make_artifact(settings, model=NAME, version=1, dtype="bfloat16"))
        asyncio.run(move_to_s3(settings.database_url, variant, endpoint=s3_endpoint, bucket=bucket))
        with _http(server) as http:
            # Up: the doors hand out the storage's own URLs (the case that must stop).
            r = http.head(f"/{NAME}/resolve/{VARIANT}/model.tensors")
            assert r.status_code == 302 and bucket in r.headers["location"], r.headers
            weights = "sha256:" + hashlib.sha256(variant.files["model.tensors"]).hexdigest()
            r = http.get(f"/v2/{NAME}/blobs/{weights}")
            assert r.status_code == 307 and bucket in r.headers["location"], r.headers
            assert http.get("/readyz").status_code == 200
            _empty_and_delete(s3_endpoint, bucket)
            poll(
                lambda: http.get("/readyz"),
                what="/readyz to find the bucket gone",
                ready=lambda r: r.status_code == 503,
                timeout=30,
            )
        yield Down(server, variant)
    finally:
        server.stop()


def test_the_hf_door_answers_storage_unavailable_with_the_hubs_headers(down: Down) -> None:
    with down.http() as http:
        for method in ("HEAD", "GET"):
            for revision, path in ((VARIANT, "model.tensors"), ("main", "model.safetensors")):
                r = http.request(method, f"/{NAME}/resolve/{revision}/{path}")
                assert r.status_code == 503, (method, path, r.status_code, r.headers)
                assert "location" not in r.headers
                assert r.headers["retry-after"]
                assert "unavailable" in r.headers["x-error-message"]
                if method == "GET":
                    assert r.json()["code"] == "storage_unavailable"
        # What does not touch the storage still answers.
        assert http.get(f"/api/models/{NAME}/revision/{VARIANT}").status_code == 200


def test_huggingface_hub_raises_and_writes_no_file(down: Down, tmp_path: Path) -> None:
    got = run_hf(
        down.server.url,
        TOKEN,
        tmp_path,
        f"""
        from huggingface_hub import hf_hub_download
        return hf_hub_download({NAME!r}, "model.tensors", revision={VARIANT!r})
        """,
        timeout=120,
    )
    # The client retries a 503 after its Retry-After (5 times), then reads it as "the Hub cannot
    # be reached" and falls back to its cache, where the file is not: its own error, caused by
    # the 503 whose X-Error-Message it shows.
    assert isinstance(got, dict) and got.get("error") == "LocalEntryNotFoundError", got
    assert "HfHubHTTPError: Server error '503" in got["stderr"], got["stderr"]
    assert "Storage 's3' is unavailable" in got["stderr"], got["stderr"]
    written = [p for p in (tmp_path / "hub").rglob("*") if p.is_file()]
    assert not [p for p in written if p.suffix == ".incomplete" or "blobs" in p.parts], written


def _blob_digest(down: Down) -> tuple[str, int]:
    """The variant's weights as a layer of its OCI manifest (read from the rows, not storage)."""
    with down.http() as http:
        r = http.get(f"/v2/{NAME}/manifests/{VARIANT}", headers={"Accept": MANIFEST_ACCEPT})
        assert r.status_code == 200, r.text
    data = down.variant.files["model.tensors"]
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert digest in [layer["digest"] for layer in r.json()["layers"]]
    return digest, len(data)


def test_the_oci_door_answers_the_distribution_specs_unavailable(down: Down) -> None:
    digest, _ = _blob_digest(down)
    with down.http() as http:
        r = http.get(f"/v2/{NAME}/blobs/{digest}")
        assert r.status_code == 503, r.headers
        assert "location" not in r.headers and r.headers["retry-after"]
        [error] = r.json()["errors"]
        assert error["code"] == "UNAVAILABLE"
        assert error["detail"]["code"] == "storage_unavailable"
        assert error["detail"]["storage"] == "s3"
        head = http.head(f"/v2/{NAME}/blobs/{digest}")
        assert head.status_code == 503 and head.content == b""


def test_oras_raises_and_writes_no_file(down: Down, tmp_path: Path) -> None:
    config = str(tmp_path / "docker-config.json")
    client = oras.client.OrasClient(hostname=down.host, insecure=True)
    client.login(username="puller", password=TOKEN, hostname=down.host, config_path=config)
    out = tmp_path / "out"
    with pytest.raises((ValueError, requests.HTTPError)) as caught:
        client.pull(target=f"{down.host}/{NAME}:{VARIANT}", outdir=str(out), config_path=config)
    assert "503" in str(caught.value) or "UNAVAILABLE" in str(caught.value), caught.value
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]
