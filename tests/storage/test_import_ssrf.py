"""The attacker's side of imports: every way to make the registry fetch an internal address, or
hang on a hostile source, through the API and the real import job (``run_import``).

The helper server listens on 127.0.0.1 and records what it gets; the settings allow-list only
the *name* ``remote.test`` (an injected resolver maps it to 127.0.0.1), so every literal
loopback spelling stays refused, and ``requests`` shows what was (not) connected to.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.hf_bytes import tiny_safetensors
from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
from tensor_registry_server.core.errors import AppError
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.versions.importer import run_import
from tests.conftest import ADMIN_TOKEN
from tests.factories import create_model
from tests.remote import RemoteServer, remote_server, without_urls
from tests.storage.conftest import S3_KEY_ID, S3_SECRET

CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()
WEIGHTS = tiny_safetensors(64)
HELPER = "remote.test"


@pytest.fixture
def settings(database_url: str, data_dir: Path, s3_endpoint: str) -> Settings:
    return Settings(
        data_dir=data_dir,
        database={"url": database_url},  # type: ignore[arg-type]
        public_url="http://testserver",
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        storage={  # type: ignore[arg-type]
            "s3": {
                "endpoint_url": s3_endpoint,
                "access_key_id": S3_KEY_ID,
                "secret_access_key": S3_SECRET,
                "bucket": "registry-own-bucket",
            },
        },
        fetch={"allow": [HELPER], "total_seconds": 60},  # type: ignore[arg-type]
    )


@pytest.fixture
def remote() -> Iterator[RemoteServer]:
    with remote_server() as server:
        yield server


def helper_resolver(host: str, port: int) -> list[str]:
    assert host == HELPER, f"unexpected DNS lookup of {host}"
    return ["127.0.0.1"]


async def post_import(client: httpx.AsyncClient, source_uri: str) -> httpx.Response:
    model = await create_model(client, name=f"acme/m-{uuid.uuid4().hex[:8]}")
    return await client.post(
        f"/api/v1/models/{model['id']}/versions", json={"source_uri": source_uri}
    )


async def start_import(client: httpx.AsyncClient, source_uri: str) -> tuple[str, int, uuid.UUID]:
    r = await post_import(client, source_uri)
    assert r.status_code == 202, r.text
    job_id = uuid.UUID(r.headers["Location"].rsplit("/", 1)[1])
    return r.json()["model_id"], r.json()["version"], job_id


async def run_job(
    settings: Settings, job_id: uuid.UUID, resolver: object = helper_resolver
) -> None:
    engine = create_engine(settings.database_url)
    storages = StorageRegistry(settings)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            # Bounded: a fetcher without caps would hang here, and the test fails instead.
            await asyncio.wait_for(
                run_import(session, storages, job_id, resolver=resolver),  # type: ignore[arg-type]
                60,
            )
    finally:
        await storages.close()
        await engine.dispose()


async def failed_job(settings: Settings, job_id: uuid.UUID, **kw: object) -> AppError:
    with pytest.raises(AppError) as caught:
        await run_job(settings, job_id, **kw)
    return caught.value


async def assert_failed_empty(
    client: httpx.AsyncClient, settings: Settings, model_id: str, number: int
) -> None:
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "failed" and version["files"] == []
    root = settings.local_storage_root / "versions" / version["id"]
    assert not root.exists() or not any(p.is_file() for p in root.rglob("*"))


def manifest(*entries: dict[str, object]) -> bytes:
    return json.dumps({"files": list(entries)}).encode()


async def test_internal_manifest_urls_are_refused_at_request_time(
    client: httpx.AsyncClient, remote: RemoteServer
) -> None:
    remote.add("/m.json", manifest({"path": "config.json"}))
    port = remote.port
    for uri in (
        f"http://127.0.0.1:{port}/m.json",
        f"http://127.1:{port}/m.json",
        f"http://0x7f000001:{port}/m.json",
        f"http://2130706433:{port}/m.json",
        f"http://[::ffff:127.0.0.1]:{port}/m.json",
        f"http://[::ffff:7f00:1]:{port}/m.json",
        f"http://[64:ff9b::7f00:1]:{port}/m.json",
        f"http://localhost:{port}/m.json",
        f"http://0177.0.0.1:{port}/m.json",
        "http://169.254.169.254/latest/meta-data/iam/",
        "https://[fd00::1]/m.json",
        "http://100.64.0.1/m.json",
        "http://[::]/m.json",
        "http://0.0.0.0/m.json",
        "http://224.0.0.1/m.json",
    ):
        r = await post_import(client, uri)
        assert r.status_code == 422, (uri, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "source_refused", (uri, r.json())
    assert remote.requests == []


async def test_a_name_that_resolves_inside_is_refused_when_the_job_connects(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer
) -> None:
    remote.add("/m.json", manifest({"path": "config.json"}))
    # Not allow-listed; its DNS answer is loopback (checked at connect time, not at request time).
    model_id, number, job_id = await start_import(
        client, f"http://sneaky.test:{remote.port}/m.json"
    )
    error = await failed_job(settings, job_id, resolver=lambda host, port: ["127.0.0.1"])
    assert error.code == "import_source_refused" and error.status == 422
    assert remote.requests == []
    await assert_failed_empty(client, settings, model_id, number)


@pytest.mark.parametrize(
    "entry_url",
    [
        "http://127.0.0.1:{port}/secret",
        "http://0x7f000001:{port}/secret",
        "http://[::ffff:127.0.0.1]:{port}/secret",
        "http://169.254.169.254/latest/meta-data/",
    ],
)
async def test_manifest_entries_pointing_inside_are_refused(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer, entry_url: str
) -> None:
    remote.add("/secret", b"internal secret bytes")
    remote.add("/config.json", CONFIG)
    remote.add(
        "/m.json",
        manifest(
            {"path": "config.json"},
            {"path": "model.safetensors", "url": entry_url.format(port=remote.port)},
        ),
    )
    model_id, number, job_id = await start_import(client, remote.url("/m.json", host=HELPER))
    error = await failed_job(settings, job_id)
    assert error.code == "import_source_refused"
    assert "/secret" not in [p for p, _ in remote.requests]
    await assert_failed_empty(client, settings, model_id, number)


async def test_a_redirect_from_an_allowed_host_to_an_internal_one_is_refused(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer
) -> None:
    remote.add("/m.json", manifest({"path": "config.json"}))
    remote.redirect("/go", remote.url("/m.json"))  # literal 127.0.0.1: refused
    model_id, number, job_id = await start_import(client, remote.url("/go", host=HELPER))
    error = await failed_job(settings, job_id)
    assert error.code == "import_source_refused"
    assert [p for p, _ in remote.requests] == ["/go"]
    await assert_failed_empty(client, settings, model_id, number)


async def test_dns_rebinding_cannot_move_the_connection(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer
) -> None:
    base = remote.url("/", host=HELPER)
    remote.add("/config.json", CONFIG)
    remote.add("/model.safetensors", WEIGHTS)
    remote.add("/m.json", manifest({"path": "config.json"}, {"path": "model.safetensors"}))
    answers: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        # The allow-listed host answers loopback once, then an address nothing listens on.
        answers.append(host)
        return ["127.0.0.1"] if len(answers) == 1 else ["::1"]

    settings.fetch.allow = ["127.0.0.1/32"]
    model_id, number, job_id = await start_import(
        client, f"{base}m.json".replace(HELPER, "rebind.test")
    )
    error = await failed_job(settings, job_id, resolver=rebinding)
    # Each URL is resolved exactly once; the first (allowed) answer is the one connected to,
    # and the later (refused) answers stop the fetch instead of being connected to.
    assert error.code == "import_source_refused"
    assert answers == ["rebind.test", "rebind.test"]
    assert [p for p, _ in remote.requests] == ["/m.json"]
    assert remote.requests[0][1] == f"rebind.test:{remote.port}"
    await assert_failed_empty(client, settings, model_id, number)


async def test_errors_say_only_that_the_source_was_unreachable(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    remote.add("/config.json", CONFIG)
    remote.add("/admin", b"internal", status=401)
    remote.add("/broken", b"", status=500)
    details = []
    for url in (
        remote.url("/admin", host=HELPER),
        remote.url("/broken", host=HELPER),
        f"http://{HELPER}:{closed}/x",
    ):
        remote.add(
            "/m.json", manifest({"path": "config.json"}, {"path": "w.safetensors", "url": url})
        )
        _, _, job_id = await start_import(client, remote.url("/m.json", host=HELPER))
        error = await failed_job(settings, job_id)
        assert error.code == "import_source_unreachable"
        details.append(error.detail)
        for leak in ("401", "500", "answered", "ConnectError", "RemoteProtocolError", "internal"):
            assert leak not in without_urls(error.detail), error.detail
    assert details[0].replace("/admin", "/x") == details[1].replace("/broken", "/x")


async def test_an_endless_source_hits_the_byte_cap(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer
) -> None:
    settings.fetch.max_bytes = 1 << 20
    remote.add("/config.json", CONFIG)
    remote.stream("/forever", b"\0" * 65536)
    remote.add(
        "/m.json", manifest({"path": "config.json"}, {"path": "w.safetensors", "url": "forever"})
    )
    model_id, number, job_id = await start_import(client, remote.url("/m.json", host=HELPER))
    error = await failed_job(settings, job_id)
    assert error.code == "import_source_too_large" and error.status == 422
    await assert_failed_empty(client, settings, model_id, number)


async def test_a_trickling_source_hits_the_deadline(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer
) -> None:
    settings.fetch.total_seconds = 1.0
    remote.add("/config.json", CONFIG)
    remote.stream("/trickle", b"\0", every=0.05)
    remote.add(
        "/m.json", manifest({"path": "config.json"}, {"path": "w.safetensors", "url": "trickle"})
    )
    model_id, number, job_id = await start_import(client, remote.url("/m.json", host=HELPER))
    error = await failed_job(settings, job_id)
    assert error.code == "import_source_timeout" and error.status == 422
    await assert_failed_empty(client, settings, model_id, number)


async def test_an_allowed_manifest_still_imports_and_checks_its_first_bytes(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer
) -> None:
    remote.add("/config.json", CONFIG)
    remote.add("/model.safetensors", WEIGHTS)
    remote.add("/m.json", manifest({"path": "config.json"}, {"path": "model.safetensors"}))
    model_id, number, job_id = await start_import(client, remote.url("/m.json", host=HELPER))
    await run_job(settings, job_id)
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "ready"
    assert [f["sha256"] for f in version["files"]] == [
        hashlib.sha256(CONFIG).hexdigest(),
        hashlib.sha256(WEIGHTS).hexdigest(),
    ]
    remote.stream("/page.html", b"<html>" * 1000)
    _, _, job_id = await start_import(client, remote.url("/page.html", host=HELPER))
    assert (await failed_job(settings, job_id)).code == "import_invalid_manifest"


async def test_s3_sources_need_an_allow_listed_bucket_and_never_the_registry_s_own(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    settings.fetch.s3_allow = ["team-models/hub/", "registry-own-bucket"]
    for uri in (
        "s3://other-bucket/hub/llama/",
        "s3://team-models/elsewhere/",
        "s3://team-models/hub-secret/",
        "s3://registry-own-bucket/",
        "s3://registry-own-bucket/artifacts/",
    ):
        r = await post_import(client, uri)
        assert r.status_code == 422 and r.json()["code"] == "source_refused", (uri, r.text)
    # Checked again by the job: the allow-list may have changed since the request.
    model_id, number, job_id = await start_import(client, "s3://team-models/hub/llama/")
    settings.fetch.s3_allow = []
    error = await failed_job(settings, job_id)
    assert error.code == "import_source_refused"
    await assert_failed_empty(client, settings, model_id, number)


async def test_credentials_in_a_source_uri_are_never_shown_or_audited(
    client: httpx.AsyncClient, settings: Settings, remote: RemoteServer
) -> None:
    secret_uri = (
        f"http://user:password@{HELPER}:{remote.port}/m.json"
        "?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIA#frag"
    )
    remote.add("/config.json", CONFIG)
    remote.add("/model.safetensors", WEIGHTS)
    remote.add("/m.json", manifest({"path": "config.json"}, {"path": "model.safetensors"}))
    model_id, number, job_id = await start_import(client, secret_uri)
    await run_job(settings, job_id)
    shown = f"http://{HELPER}:{remote.port}/m.json"
    version = (await client.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    assert version["status"] == "ready" and version["source_uri"] == shown
    job = (await client.get(f"/api/v1/jobs/{job_id}")).json()
    assert job["params"]["source_uri"] == shown
    listed = (await client.get(f"/api/v1/models/{model_id}/versions")).text
    audit = (await client.get("/api/v1/audit", params={"limit": 500})).text
    for text in (str(version), str(job), listed, audit):
        for secret in ("password", "user:", "X-Amz-Signature", "deadbeef", "AKIA"):
            assert secret not in text
    assert shown in audit
    # The raw URI was used for the import: the credentials went to the source, nowhere else.
    assert remote.requests[0][0] == "/m.json?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIA"
