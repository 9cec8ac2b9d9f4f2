"""A real `tensor-registry serve` for the OCI door, on the embedded default (SQLite, local
storage) and on PostgreSQL + S3 (moto on loopback), with one model ready to pull:

    acme/llama   versions 1 and 2 (config, tokenizer, README, safetensors), alias prod → 1,
                 a bfloat16 hf tp1 variant of version 1 and an encrypted float16 hf tp1 variant of
                 version 2 (tensorizer, made directly, no worker)
    acme/other   version 1, whose safetensors differs from acme/llama's
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.artifacts import MadeArtifact, make_artifact
from harness.hf_bytes import tiny_safetensors
from harness.serve_process import ServeProcess, free_port
from tensor_registry_server.settings import Settings
from tests.conftest import migrated_database
from tests.storage.conftest import S3_KEY_ID, S3_SECRET, make_bucket, s3_endpoint
from tests.storage.helpers import move_to_s3

__all__ = ["s3_endpoint"]  # the session fixture, for the PostgreSQL + S3 run

TOKEN = "trg_oci-door-tests-admin-0123456789abcdefghijklmn"
SIGNING_KEY = "oci-door-tests-signing-key-0123456789abcdefghijkl"
MODEL = "acme/llama"
OTHER = "acme/other"
README = b"# llama\n\nA tiny test model.\n"


@dataclass
class Door:
    server: ServeProcess
    settings: Settings
    backend: str
    sources: dict[int, dict[str, bytes]] = field(default_factory=dict)
    variant: MadeArtifact | None = None
    encrypted: MadeArtifact | None = None
    other: dict[str, bytes] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://")

    def http(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def basic(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, auth=("anyone", token), timeout=30)

    def token_with(self, *scopes: str, namespaces: list[str] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": "oci", "scopes": list(scopes)}
        if namespaces is not None:
            body["namespaces"] = namespaces
        with self.http() as http:
            r = http.post("/api/v1/tokens", json=body)
            assert r.status_code == 201, r.text
            return dict(r.json())


def _publish(http: httpx.Client, name: str, files_by_version: list[dict[str, bytes]]) -> None:
    model = http.post("/api/v1/models", json={"name": name})
    assert model.status_code == 201, model.text
    model_id = model.json()["id"]
    for files in files_by_version:
        number = http.post(f"/api/v1/models/{model_id}/versions", json={}).json()["version"]
        for path, data in files.items():
            up = http.put(
                f"/api/v1/models/{model_id}/versions/{number}/files/{path}",
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            )
            assert up.status_code == 201, up.text
        done = http.post(f"/api/v1/models/{model_id}/versions/{number}/finalize")
        assert done.status_code == 200, done.text


def _source(seed: int) -> dict[str, bytes]:
    return {
        "config.json": json.dumps(
            {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "seed": seed}
        ).encode(),
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
        "README.md": README,
        "model.safetensors": tiny_safetensors(values=16 * seed),
    }


@pytest.fixture(scope="module", params=["embedded", "postgresql-s3"])
def door(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Door]:
    backend = request.param
    data_dir = tmp_path_factory.mktemp("oci-serve") / "data"
    env = {
        "TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN,
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
        "TENSOR_REGISTRY_LOG_LEVEL": "INFO",
    }
    with _database(backend, tmp_path_factory, data_dir) as database_url:
        settings_kw: dict[str, Any] = {}
        bucket = endpoint = None
        if backend != "embedded":
            endpoint = request.getfixturevalue("s3_endpoint")
            bucket = make_bucket(endpoint)
            env |= {
                "TENSOR_REGISTRY_DATABASE__URL": database_url,
                "TENSOR_REGISTRY_STORAGE__DEFAULT_BACKEND": "s3",
                "TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL": endpoint,
                "TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID": S3_KEY_ID,
                "TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY": S3_SECRET,
                "TENSOR_REGISTRY_STORAGE__S3__BUCKET": bucket,
            }
        server = ServeProcess(data_dir=data_dir, port=free_port(), env=env).start()
        try:
            settings = Settings(
                data_dir=data_dir,
                database={"url": database_url},  # type: ignore[arg-type]
                storage={},  # type: ignore[arg-type]
                security={"signing_key": SIGNING_KEY},  # type: ignore[arg-type]
                **settings_kw,
            )
            door = Door(server=server, settings=settings, backend=backend)
            door.sources = {1: _source(1), 2: _source(2)}
            door.other = _source(3)
            with door.http() as http:
                _publish(http, MODEL, [door.sources[1], door.sources[2]])
                _publish(http, OTHER, [door.other])
                model_id = http.get("/api/v1/models", params={"name": MODEL}).json()["items"][0][
                    "id"
                ]
                r = http.put(f"/api/v1/models/{model_id}/aliases/prod", json={"version": 1})
                assert r.status_code in (200, 201), r.text
            made = asyncio.run(
                make_artifact(settings, model=MODEL, version=1, dtype="bfloat16", layout=True)
            )
            encrypted = asyncio.run(
                make_artifact(settings, model=MODEL, version=2, dtype="float16", encrypted=True)
            )
            if bucket is not None and endpoint is not None:
                for artifact in (made, encrypted):
                    asyncio.run(
                        move_to_s3(
                            settings.database_url, artifact, endpoint=endpoint, bucket=bucket
                        )
                    )
            door.variant, door.encrypted = made, encrypted
            yield door
        finally:
            server.stop()


class _database:
    """The embedded default's own SQLite file, or a fresh migrated PostgreSQL database."""

    def __init__(self, backend: str, factory: pytest.TempPathFactory, data_dir: Path) -> None:
        self.backend, self.factory, self.data_dir = backend, factory, data_dir
        self._ctx: Any = None

    def __enter__(self) -> str:
        if self.backend == "embedded":
            return f"sqlite+aiosqlite:///{self.data_dir / 'registry.db'}"
        self._ctx = migrated_database("postgresql", self.factory, label="oci")
        return str(self._ctx.__enter__())

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
