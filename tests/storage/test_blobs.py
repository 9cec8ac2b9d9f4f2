"""Signed blob URLs on the ASGI app: ranges, HEAD, validators, signature checks, every backend.

(The same route on a real server, with curl and tensorizer's reader: test_blobs_live.py.)
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tensor_registry_server.main import create_app
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.signing import blob_url, sign
from tests.storage.conftest import S3_KEY_ID, S3_SECRET, make_bucket
from tests.storage.helpers import chunks_of, payload

SIGNING_KEY = "blob-test-signing-key-0123456789abcdefghijklmnopqrstuv"


class NoSender:
    def send_task(self, name: str, args: list[str], queue: str) -> object:
        raise AssertionError("the blob route enqueues nothing")


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        public_url="http://testserver",
        security={"signing_key": SIGNING_KEY},  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
async def blob_app(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Settings, object]]:
    """The real app; the blob route needs no database or token, so none is set up."""
    settings = _settings(tmp_path)
    app = create_app(settings, task_sender=NoSender())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield client, settings, app


def url_for(settings: Settings, key: str, *, storage: str = "local", ttl: int = 600) -> str:
    full = blob_url(settings.public_url, SIGNING_KEY.encode(), storage=storage, key=key, ttl=ttl)
    return full.removeprefix(settings.public_url)


def put_local(settings: Settings, key: str, data: bytes) -> None:
    path = settings.local_storage_root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


DATA = payload(1_000_003)
KEY = f"artifacts/{uuid.uuid4()}/model.tensors"


async def test_full_get_has_the_headers_tensorizer_needs(blob_app) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    url = url_for(settings, KEY)
    assert "%" not in url
    r = await client.get(url)
    assert r.status_code == 200
    assert r.content == DATA
    assert r.headers["accept-ranges"] == "bytes"
    assert r.headers["content-length"] == str(len(DATA))
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["cache-control"].startswith("private")
    assert re.fullmatch(r'"[0-9a-f]+-[0-9a-f]+"', r.headers["etag"])
    assert r.headers["last-modified"].endswith("GMT")
    assert "x-request-id" in r.headers


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=0-0", 0, 0),
        ("bytes=100-199", 100, 199),
        ("bytes=999990-", 999990, 1_000_002),
        ("bytes=-10", 1_000_003 - 10, 1_000_002),
        ("bytes=500-99999999", 500, 1_000_002),
        ("bytes=-99999999", 0, 1_000_002),
    ],
)
async def test_single_ranges_are_206_with_exact_bytes(
    blob_app, header: str, start: int, end: int
) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    r = await client.get(url_for(settings, KEY), headers={"Range": header})
    assert r.status_code == 206
    assert r.content == DATA[start : end + 1]
    assert r.headers["content-range"] == f"bytes {start}-{end}/{len(DATA)}"
    assert r.headers["content-length"] == str(end - start + 1)


async def test_multiple_ranges_are_multipart_byteranges(blob_app) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    r = await client.get(url_for(settings, KEY), headers={"Range": "bytes=0-9, 500-509, -5"})
    assert r.status_code == 206
    boundary = r.headers["content-type"].split("boundary=")[1]
    assert r.headers["content-type"].startswith("multipart/byteranges")
    assert int(r.headers["content-length"]) == len(r.content)
    parts = r.content.split(f"--{boundary}".encode())[1:-1]
    bodies = []
    for part in parts:
        head, body = part.split(b"\r\n\r\n", 1)
        bodies.append((re.search(rb"content-range: bytes (\d+)-(\d+)/", head).groups(), body[:-2]))  # type: ignore[union-attr]
    assert bodies == [
        ((b"0", b"9"), DATA[0:10]),
        ((b"500", b"509"), DATA[500:510]),
        ((b"999998", b"1000002"), DATA[-5:]),
    ]


@pytest.mark.parametrize(
    "header",
    ["bytes=" + ",".join(["0-"] * 16), "bytes=" + ",".join(["-1000003"] * 16), "bytes=0-99,50-"],
    ids=["open-x16", "suffix-x16", "overlap"],
)
async def test_overlapping_ranges_send_the_file_at_most_once(blob_app, header: str) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    r = await client.get(url_for(settings, KEY), headers={"Range": header})
    assert r.status_code == 200
    assert len(r.content) == len(DATA)
    assert r.content == DATA


async def test_disjoint_ranges_stay_multipart(blob_app) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    r = await client.get(url_for(settings, KEY), headers={"Range": "bytes=0-9,10-19"})
    assert r.status_code == 206
    assert r.headers["content-type"].startswith("multipart/byteranges")
    assert len(r.content) < 20 + 400


@pytest.mark.parametrize("header", ["bytes=1000003-", "bytes=2000000-2000010", "bytes=-0"])
async def test_unsatisfiable_range_is_416_with_the_size(blob_app, header: str) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    r = await client.get(url_for(settings, KEY), headers={"Range": header})
    assert r.status_code == 416
    assert r.headers["content-range"] == f"bytes */{len(DATA)}"
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "range_not_satisfiable"


@pytest.mark.parametrize("header", ["items=0-5", "bytes=5-1", "bytes=abc", "bytes=", "bytes=1-2-3"])
async def test_malformed_ranges_are_ignored(blob_app, header: str) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    r = await client.get(url_for(settings, KEY), headers={"Range": header})
    assert r.status_code == 200 and r.content == DATA


async def test_if_range_and_head(blob_app) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    url = url_for(settings, KEY)
    head = await client.head(url)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(DATA))
    etag, modified = head.headers["etag"], head.headers["last-modified"]
    assert (
        await client.get(url, headers={"Range": "bytes=0-3", "If-Range": etag})
    ).status_code == 206
    assert (
        await client.get(url, headers={"Range": "bytes=0-3", "If-Range": modified})
    ).status_code == 206
    stale = await client.get(url, headers={"Range": "bytes=0-3", "If-Range": '"other"'})
    assert stale.status_code == 200 and stale.content == DATA
    ranged_head = await client.head(url, headers={"Range": "bytes=10-19"})
    assert ranged_head.status_code == 206 and ranged_head.headers["content-length"] == "10"


async def test_empty_file(blob_app) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    key = f"versions/{uuid.uuid4()}/u0/empty.json"
    put_local(settings, key, b"")
    r = await client.get(url_for(settings, key))
    assert (
        r.status_code == 200
        and r.content == b""
        and r.headers["content-type"] == "application/json"
    )
    assert (
        await client.get(url_for(settings, key), headers={"Range": "bytes=0-"})
    ).status_code == 416


async def test_signature_failures_are_403_and_missing_files_404(blob_app) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    url = url_for(settings, KEY)
    path, query = url.split("?")
    params = {k: v[0] for k, v in parse_qs(query).items()}

    async def code(u: str) -> tuple[int, str]:
        r = await client.get(u)
        return r.status_code, r.json()["code"]

    expired = sign(
        SIGNING_KEY.encode(), purpose="blob", subject=f"local:{KEY.rsplit('/', 1)[0]}/", ttl=-5
    )
    assert await code(f"{path}?{expired.query()}") == (403, "signature_expired")
    tampered = params["sig"][:-2] + ("AA" if not params["sig"].endswith("AA") else "BB")
    assert await code(f"{path}?exp={params['exp']}&sig={tampered}") == (403, "signature_invalid")
    assert await code(f"{path}?exp={int(params['exp']) + 1000}&sig={params['sig']}") == (
        403,
        "signature_invalid",
    )
    assert await code(path) == (403, "signature_invalid")
    other_artifact = f"artifacts/{uuid.uuid4()}/model.tensors"
    put_local(settings, other_artifact, b"secret")
    assert await code(f"/api/v1/blobs/local/{other_artifact}?{query}") == (403, "signature_invalid")
    assert await code(f"/api/v1/blobs/s3/{KEY}?{query}") == (403, "signature_invalid")
    assert await code(f"/api/v1/blobs/local/model.tensors?{query}") == (403, "signature_invalid")
    # Signed scope, but no such file: only now does existence matter.
    sibling = KEY.rsplit("/", 1)[0] + "/missing.tensors"
    assert await code(f"/api/v1/blobs/local/{sibling}?{query}") == (404, "blob_not_found")
    directory = KEY.rsplit("/", 1)[0] + "/sub"
    (settings.local_storage_root / directory).mkdir(parents=True)
    assert await code(f"/api/v1/blobs/local/{directory}?{query}") == (404, "blob_not_found")


async def test_a_rank_template_signature_covers_every_rank_file(blob_app) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    prefix = f"artifacts/{uuid.uuid4()}"
    for rank in range(2):
        put_local(settings, f"{prefix}/model-rank-{rank:03d}.tensors", f"rank {rank}".encode())
    template = url_for(settings, f"{prefix}/model-rank-%03d.tensors")
    assert template.count("%") == 1
    for rank in range(2):
        r = await client.get(template % rank)
        assert r.status_code == 200 and r.content == f"rank {rank}".encode()


async def test_bytes_served_are_counted(blob_app) -> None:  # type: ignore[no-untyped-def]
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)

    async def counted() -> float:
        text = (await client.get("/metrics")).text
        match = re.search(r'tensor_registry_blob_bytes_served_total\{storage="local"\} (\S+)', text)
        return float(match.group(1)) if match else 0.0

    before = await counted()
    await client.get(url_for(settings, KEY), headers={"Range": "bytes=0-99"})
    assert await counted() == before + 100


@pytest.fixture
async def proxied_app(
    tmp_path: Path, s3_endpoint: str, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, Settings, object]]:
    bucket = make_bucket(s3_endpoint)
    settings = _settings(
        tmp_path,
        storage={
            "s3": {
                "endpoint_url": s3_endpoint,
                "access_key_id": S3_KEY_ID,
                "secret_access_key": S3_SECRET,
                "bucket": bucket,
                "prefix": "p",
            },
            "redis": {
                "url": redis_url,
                "prefix": f"tr-test-{uuid.uuid4().hex[:8]}/",
                "chunk_mb": 1,
            },
        },
    )
    app = create_app(settings, task_sender=NoSender())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield client, settings, app
        await app.state.storages.get("redis").delete_prefix("artifacts/")


@pytest.mark.parametrize("backend", ["s3", "redis"])
async def test_s3_and_redis_objects_are_proxied_with_ranges(proxied_app, backend: str) -> None:  # type: ignore[no-untyped-def]
    client, settings, app = proxied_app
    data = payload(3 * 1024 * 1024 + 17, seed=8)
    # The rank template is built, not found by replacing "001": a uuid may hold "001" too.
    ranked = f"artifacts/{uuid.uuid4()}/model-rank-%03d.tensors"
    key = ranked % 1
    await app.state.storages.get(backend).put_stream(key, chunks_of(data))
    template = url_for(settings, ranked, storage=backend)
    url = template % 1
    full = await client.get(url)
    assert full.status_code == 200 and full.content == data
    assert full.headers["accept-ranges"] == "bytes"
    start, end = 1024 * 1024 - 5, 2 * 1024 * 1024 + 5
    part = await client.get(url, headers={"Range": f"bytes={start}-{end}"})
    assert part.status_code == 206 and part.content == data[start : end + 1]
    head = await client.head(url)
    assert head.headers["content-length"] == str(len(data))
    missing = await client.get(template % 2)
    assert (missing.status_code, missing.json()["code"]) == (404, "blob_not_found")


def test_signed_urls_expire_by_the_clock() -> None:
    query = urlsplit(blob_url("http://x", b"k", storage="local", key="artifacts/a/f", ttl=60)).query
    exp = int(parse_qs(query)["exp"][0])
    assert time.time() + 55 < exp <= time.time() + 61


async def test_a_signed_range_request_never_waits_for_the_thread_pool(
    blob_app, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The blob route's dependencies run on the event loop: FastAPI runs a plain ``def``
    dependency on its thread pool, and on a busy host every such hand-off made each of the
    engine's range requests wait (tensor_registry_server/deps.py)."""
    import fastapi.dependencies.utils
    import fastapi.routing

    async def no_pool(*args: object, **kwargs: object) -> object:
        raise AssertionError("a thread-pool hand-off on the blob route")

    for module in (fastapi.dependencies.utils, fastapi.routing):
        monkeypatch.setattr(module, "run_in_threadpool", no_pool)
    client, settings, _ = blob_app
    put_local(settings, KEY, DATA)
    r = await client.get(url_for(settings, KEY), headers={"Range": "bytes=10-19"})
    assert r.status_code == 206 and r.content == DATA[10:20]
