"""The Hugging Face door on the scaled setup: a real `serve` on PostgreSQL with S3 storage (the
S3 server on loopback). Files are handed out as the Hub hands out its CDN: ``HEAD`` answers 302
to the storage's presigned URL with the size and sha256 in ``X-Linked-Size``/``X-Linked-Etag``,
and the client downloads from S3 itself, without the registry token. With presigning off
(``storage.s3.presign_downloads``) the door streams the object through the blob serving path."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.artifacts import MadeArtifact, make_artifact
from harness.serve_process import ServeProcess, free_port
from tensor_registry_server.settings import Settings
from tests.conftest import migrated_database
from tests.hf_door.hf import run_hf
from tests.hf_fixtures import make_tiny_llama
from tests.storage.conftest import S3_KEY_ID, S3_SECRET, make_bucket, s3_endpoint  # noqa: F401
from tests.storage.helpers import move_to_s3

pytestmark = pytest.mark.slow

TOKEN = "trg_hf-door-scaled-0123456789abcdefghijklmnop"
NAME = "scaled/tiny-llama"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class Scaled:
    server: ServeProcess
    presigned: bool
    bucket: str
    endpoint: str
    files: dict[str, bytes]
    variant: MadeArtifact

    def door_requests(self) -> list[dict[str, Any]]:
        return [
            json.loads(line)
            for line in list(self.server.lines)
            if '"event": "request"' in line and f"/{NAME}/resolve/" in line
        ]


@pytest.fixture(scope="module", params=["presigned", "streamed"])
def scaled(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    s3_endpoint: str,  # noqa: F811
) -> Iterator[Scaled]:
    presigned = request.param == "presigned"
    bucket = make_bucket(s3_endpoint)
    with migrated_database("postgresql", tmp_path_factory, label="hfdoor") as database_url:
        data_dir = tmp_path_factory.mktemp("scaled") / "data"
        server = ServeProcess(
            data_dir=data_dir,
            port=free_port(),
            env={
                "TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN,
                "TENSOR_REGISTRY_LOG_LEVEL": "INFO",
                "TENSOR_REGISTRY_DATABASE__URL": database_url,
                "TENSOR_REGISTRY_STORAGE__DEFAULT_BACKEND": "s3",
                "TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL": s3_endpoint,
                "TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID": S3_KEY_ID,
                "TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY": S3_SECRET,
                "TENSOR_REGISTRY_STORAGE__S3__BUCKET": bucket,
                "TENSOR_REGISTRY_STORAGE__S3__PRESIGN_DOWNLOADS": str(presigned).lower(),
            },
        ).start()
        try:
            source = make_tiny_llama(tmp_path_factory.mktemp("scaled-src"), with_tokenizer=False)
            files = {p.name: p.read_bytes() for p in sorted(source.iterdir()) if p.is_file()}
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
            ) as http:
                model = http.post("/api/v1/models", json={"name": NAME}).json()
                http.post(f"/api/v1/models/{model['id']}/versions", json={})
                for path, data in files.items():
                    r = http.put(
                        f"/api/v1/models/{model['id']}/versions/1/files/{path}", content=data
                    )
                    assert r.status_code == 201, r.text
                r = http.post(f"/api/v1/models/{model['id']}/versions/1/finalize")
                assert r.status_code == 200, r.text
            settings = Settings(
                data_dir=data_dir,
                database={"url": database_url},  # type: ignore[arg-type]
                storage={},  # type: ignore[arg-type]
                security={},  # type: ignore[arg-type]
            )
            made = asyncio.run(make_artifact(settings, model=NAME, version=1, dtype="bfloat16"))
            asyncio.run(
                move_to_s3(settings.database_url, made, endpoint=s3_endpoint, bucket=bucket)
            )
            yield Scaled(server, presigned, bucket, s3_endpoint, files, made)
        finally:
            server.stop()


SNAPSHOT = """
from huggingface_hub import snapshot_download
return snapshot_download({name!r}, revision={revision!r})
"""


@pytest.mark.parametrize("revision", ["main", "1.bfloat16.hf.tp1"])
def test_snapshot_download_from_postgresql_and_s3(
    scaled: Scaled, revision: str, tmp_path: Path
) -> None:
    expected = scaled.files if revision == "main" else scaled.variant.files
    folder = Path(
        run_hf(scaled.server.url, TOKEN, tmp_path, SNAPSHOT.format(name=NAME, revision=revision))
    )
    assert COMMIT.match(folder.name)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == expected
    asked = [r for r in scaled.door_requests() if f"/resolve/{folder.name}/" in r["path"]]
    assert {r["path"].rsplit("/", 1)[1] for r in asked} == set(expected)
    if scaled.presigned:
        # Every file was a HEAD answered by a redirect: no byte came through the registry.
        assert {(r["method"], r["status"]) for r in asked} == {("HEAD", 302)}
    else:
        # A HEAD and a GET per file, the bytes streamed from S3 by the registry.
        assert sorted((r["method"], r["status"]) for r in asked) == sorted(
            [("HEAD", 200), ("GET", 200)] * len(expected)
        )


def test_the_headers_the_client_checks(scaled: Scaled) -> None:
    data = scaled.variant.files["model.tensors"]
    url = f"{scaled.server.url}/{NAME}/resolve/1.bfloat16.hf.tp1/model.tensors"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.head(url, headers=auth)
    if not scaled.presigned:
        assert r.status_code == 200
        assert r.headers["content-length"] == str(len(data))
        assert r.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
        assert COMMIT.match(r.headers["x-repo-commit"])
        part = httpx.get(url, headers={**auth, "Range": "bytes=100-"})
        assert part.status_code == 206 and part.content == data[100:]
        return
    assert r.status_code == 302
    assert r.headers["x-linked-size"] == str(len(data))
    assert r.headers["x-linked-etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert COMMIT.match(r.headers["x-repo-commit"])
    location = r.headers["location"]
    assert location.startswith(f"{scaled.endpoint}/{scaled.bucket}/")
    # The presigned URL alone (no token) gives the bytes.
    assert httpx.get(location).content == data
