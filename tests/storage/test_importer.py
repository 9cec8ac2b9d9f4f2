"""Imports: POST …/versions {"source_uri": …} then the import job, from file://, http(s) and s3://.

The job body (`run_import`) runs here in the test's event loop on the real database and
storage; the worker wiring around it is tested with the workers.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from harness.hf_bytes import tiny_safetensors
from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
from tensor_registry_server.core.errors import AppError
from tensor_registry_server.core.events_outbox import EventRecord, read_after
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.versions.importer import run_import
from tests.conftest import ADMIN_TOKEN
from tests.factories import create_model
from tests.storage.conftest import S3_KEY_ID, S3_SECRET, make_bucket

CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()
WEIGHTS = tiny_safetensors(64)


@pytest.fixture
def settings(database_url: str, data_dir: Path, s3_endpoint: str) -> Settings:
    """The suite's settings plus an S3 endpoint (for s3:// sources); the loopback helper
    servers are allow-listed for the fetcher (attack tests in test_import_ssrf.py use none)."""
    return Settings(
        data_dir=data_dir,
        database={"url": database_url},  # type: ignore[arg-type]
        public_url="http://testserver",
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        storage={  # type: ignore[arg-type]
            "import_roots": [str(data_dir.parent / "imports")],
            "s3": {
                "endpoint_url": s3_endpoint,
                "access_key_id": S3_KEY_ID,
                "secret_access_key": S3_SECRET,
            },
        },
        fetch={"allow": ["127.0.0.1"]},  # type: ignore[arg-type]
    )


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


async def start_import(client: httpx.AsyncClient, source_uri: str) -> tuple[str, int, uuid.UUID]:
    model = await create_model(client, name=f"acme/m-{uuid.uuid4().hex[:8]}")
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={"source_uri": source_uri})
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "importing"
    job_id = uuid.UUID(r.headers["Location"].rsplit("/", 1)[1])
    return model["id"], r.json()["version"], job_id


async def run_job(
    settings: Settings, job_id: uuid.UUID, *, sync_progress: bool = False
) -> list[tuple[int, int | None]]:
    engine = create_engine(settings.database_url)
    storages = StorageRegistry(settings)
    seen: list[tuple[int, int | None]] = []

    async def progress(done: int, total: int | None) -> None:
        seen.append((done, total))

    def plain_progress(done: int, total: int | None) -> None:
        seen.append((done, total))

    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            await run_import(
                session, storages, job_id, progress=plain_progress if sync_progress else progress
            )
    finally:
        await storages.close()
        await engine.dispose()
    return seen


async def failed_job(settings: Settings, job_id: uuid.UUID) -> AppError:
    with pytest.raises(AppError) as caught:
        await run_job(settings, job_id)
    return caught.value


async def _events(settings: Settings) -> list[EventRecord]:
    engine = create_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            return await read_after(session, 0)
    finally:
        await engine.dispose()


def version_bytes(settings: Settings, version_id: str) -> list[Path]:
    root = settings.local_storage_root / "versions" / version_id
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


async def test_file_import_copies_files_with_sha256_and_freezes(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    source = write_tree(
        settings.storage.import_roots[0] / "llama",
        {
            "config.json": CONFIG,
            "model.safetensors": WEIGHTS,
            "tokenizer/vocab.txt": b"a\nb\n",
            ".cache/junk": b"skipped",
        },
    )
    model_id, number, job_id = await start_import(client, f"file://{source}")
    progress = await run_job(settings, job_id)
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "ready" and version["finalized_at"]
    # An import keeps what validation read, as finalize does (the model page shows it).
    assert version["parameter_count"] == 64
    assert version["dtype_breakdown"] == {"F32": {"tensors": 1, "parameters": 64, "bytes": 256}}
    assert version["architecture"] == "LlamaForCausalLM"
    assert version["files"] == [
        {"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
        for p, d in (
            ("config.json", CONFIG),
            ("model.safetensors", WEIGHTS),
            ("tokenizer/vocab.txt", b"a\nb\n"),
        )
    ]
    total = len(CONFIG) + len(WEIGHTS) + 4
    assert progress[0] == (0, total) and progress[-1] == (total, total)
    # The freeze wrote its event in the same transaction.
    events = await _events(settings)
    [ready] = [e for e in events if e.type == "version.ready"]
    assert ready.data["version"] == number and ready.data["source"] == "import"
    stored = version_bytes(settings, version["id"])
    assert sorted(p.read_bytes() for p in stored) == sorted([CONFIG, WEIGHTS, b"a\nb\n"])
    # Running the job again (a redelivered message) changes nothing.
    await run_job(settings, job_id)
    assert version_bytes(settings, version["id"]) == stored


async def test_file_import_outside_the_roots_is_refused_up_front(
    client: httpx.AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    model = await create_model(client, name="acme/outside")
    for uri in (
        f"file://{tmp_path}",
        "file:///etc",
        f"file://{settings.storage.import_roots[0]}/../x",
    ):
        r = await client.post(f"/api/v1/models/{model['id']}/versions", json={"source_uri": uri})
        assert r.status_code == 422 and r.json()["code"] == "import_root_forbidden", uri
    r = await client.post(
        f"/api/v1/models/{model['id']}/versions", json={"source_uri": "ftp://x/y"}
    )
    assert r.json()["code"] == "invalid_source_uri"
    assert (await client.get(f"/api/v1/models/{model['id']}/versions")).json()["items"] == []


async def test_symlink_out_of_the_root_fails_the_import_and_keeps_nothing(
    client: httpx.AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(WEIGHTS)
    source = write_tree(settings.storage.import_roots[0] / "linky", {"config.json": CONFIG})
    (source / "model.safetensors").symlink_to(secret)
    model_id, number, job_id = await start_import(client, f"file://{source}")
    error = await failed_job(settings, job_id)
    assert error.code == "import_root_forbidden"
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "failed" and version["files"] == []
    assert version_bytes(settings, version["id"]) == []


async def test_invalid_content_fails_validation_and_removes_the_copies(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    source = write_tree(
        settings.storage.import_roots[0] / "noconfig", {"model.safetensors": b"not safetensors"}
    )
    model_id, number, job_id = await start_import(client, f"file://{source}")
    error = await failed_job(settings, job_id)
    assert error.code == "invalid_version"
    assert {p["code"] for p in error.extra["problems"]} == {"missing_config", "corrupt_weights"}
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "failed" and version["files"] == []
    assert version_bytes(settings, version["id"]) == []
    empty = settings.storage.import_roots[0] / "empty"
    empty.mkdir()
    _, _, job_id = await start_import(client, f"file://{empty}")
    assert (await failed_job(settings, job_id)).code == "import_source_empty"


@pytest.fixture
def http_source(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A plain HTTP server on loopback serving a directory (what a manifest points at)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


async def test_manifest_import_over_http_verifies_declared_checksums(
    client: httpx.AsyncClient, settings: Settings, http_source: tuple[str, Path]
) -> None:
    base, root = http_source
    write_tree(root, {"models/a/config.json": CONFIG, "blobs/w1.bin": WEIGHTS})
    manifest = {
        "files": [
            {"path": "config.json", "size": len(CONFIG)},  # url defaults to the path, relative
            {
                "path": "model.safetensors",
                "url": "../../blobs/w1.bin",
                "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
            },
        ]
    }
    (root / "models/a/manifest.json").write_text(json.dumps(manifest))
    model_id, number, job_id = await start_import(client, f"{base}/models/a/manifest.json")
    progress = await run_job(settings, job_id, sync_progress=True)
    assert progress[-1] == (len(CONFIG) + len(WEIGHTS), None)  # one size was not declared
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "ready"
    assert [(f["path"], f["sha256"]) for f in version["files"]] == [
        ("config.json", hashlib.sha256(CONFIG).hexdigest()),
        ("model.safetensors", hashlib.sha256(WEIGHTS).hexdigest()),
    ]


@pytest.mark.parametrize(
    ("manifest", "code"),
    [
        (
            {"files": [{"path": "config.json"}, {"path": "model.safetensors", "sha256": "0" * 64}]},
            "import_checksum_mismatch",
        ),
        (
            {"files": [{"path": "config.json", "size": 3}, {"path": "model.safetensors"}]},
            "import_size_mismatch",
        ),
        (
            {"files": [{"path": "config.json"}, {"path": "gone.safetensors"}]},
            "import_source_unreachable",
        ),
        ({"files": [{"path": "../etc/passwd"}]}, "import_invalid_path"),
        ({"items": []}, "import_invalid_manifest"),
        ({"files": []}, "import_source_empty"),
    ],
)
async def test_bad_manifests_fail_with_a_clear_code_and_no_half_version(
    client: httpx.AsyncClient,
    settings: Settings,
    http_source: tuple[str, Path],
    manifest: dict[str, Any],
    code: str,
) -> None:
    base, root = http_source
    write_tree(root, {"config.json": CONFIG, "model.safetensors": WEIGHTS})
    (root / "manifest.json").write_text(json.dumps(manifest))
    model_id, number, job_id = await start_import(client, f"{base}/manifest.json")
    error = await failed_job(settings, job_id)
    assert error.code == code
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "failed" and version["files"] == []
    assert version_bytes(settings, version["id"]) == []


async def test_s3_prefix_import(
    client: httpx.AsyncClient, settings: Settings, s3_endpoint: str
) -> None:
    bucket = await asyncio.to_thread(make_bucket, s3_endpoint)
    s3 = boto3.client(
        "s3", endpoint_url=s3_endpoint, aws_access_key_id=S3_KEY_ID,
        aws_secret_access_key=S3_SECRET, region_name="us-east-1",
    )  # fmt: skip
    for key, data in (
        ("hub/llama/config.json", CONFIG),
        ("hub/llama/model.safetensors", WEIGHTS),
        ("hub/llama/", b""),  # a console-made "folder"
        ("hub/llama-other/config.json", b"not this one"),
    ):
        await asyncio.to_thread(s3.put_object, Bucket=bucket, Key=key, Body=data)
    settings.fetch.s3_allow = [f"{bucket}/hub/", "no-such-bucket-for-sure"]
    model_id, number, job_id = await start_import(client, f"s3://{bucket}/hub/llama")
    progress = await run_job(settings, job_id)
    assert progress[-1] == (len(CONFIG) + len(WEIGHTS),) * 2
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "ready"
    assert [f["path"] for f in version["files"]] == ["config.json", "model.safetensors"]
    assert sorted(p.read_bytes() for p in version_bytes(settings, version["id"])) == sorted(
        [CONFIG, WEIGHTS]
    )

    settings.fetch.s3_allow.append(f"{bucket}/nothing-here/")
    _, number, job_id = await start_import(client, f"s3://{bucket}/nothing-here/")
    assert (await failed_job(settings, job_id)).code == "import_source_empty"
    _, number, job_id = await start_import(client, "s3://no-such-bucket-for-sure/x/")
    assert (await failed_job(settings, job_id)).code == "import_source_unreachable"


async def test_a_file_swapped_for_a_link_after_listing_is_not_read(
    client: httpx.AsyncClient,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Listing checked the real file; the reader opens it again without following links."""
    from tensor_registry_server.versions import import_sources

    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(WEIGHTS)
    source = write_tree(
        settings.storage.import_roots[0] / "swapped",
        {"config.json": CONFIG, "model.safetensors": WEIGHTS},
    )
    listed = import_sources.list_directory

    def list_then_swap(uri: str, settings: Settings) -> list[import_sources.SourceFile]:
        files = listed(uri, settings)
        (source / "model.safetensors").unlink()
        (source / "model.safetensors").symlink_to(secret)
        return files

    monkeypatch.setattr(import_sources, "list_directory", list_then_swap)
    model_id, number, job_id = await start_import(client, f"file://{source}")
    error = await failed_job(settings, job_id)
    assert error.code == "import_root_forbidden"
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "failed" and version["files"] == []
    assert version_bytes(settings, version["id"]) == []
