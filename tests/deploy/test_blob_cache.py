"""The fan-out tier (deploy/nginx-cache.conf) in front of a real `tensor-registry serve`.

The shipped config runs in Debian's nginx with only its addresses and cache folder changed:
the registry's public URL is the cache, so resolve hands out URLs through it. Checked: the
bytes nodes get are the file's, ranges are exact, the origin sends each slice once however many
signed URLs ask (the cache key is the content, not the signature), and an altered or expired
signature is refused at the edge although the bytes are cached; the registry's auth check moves
no bytes.
"""

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
import torch

from harness import nginx
from harness.artifacts import make_artifact
from harness.serve_process import ROOT, ServeProcess, free_port
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.signing import sign
from tests.client.conftest import TOKEN, Registry

CONFIG = ROOT / "deploy" / "nginx-cache.conf"
BLOB_ROUTE = "/api/v1/blobs/{storage}/{key:path}"
AUTH_ROUTE = "/api/v1/blobs/auth"
SLICE = 8 << 20


@dataclass
class Tier:
    cache: str
    origin: ServeProcess
    registry: Registry
    folder: Path

    @property
    def settings(self) -> Settings:
        return self.registry.settings

    def origin_requests(self, route: str) -> list[dict[str, Any]]:
        """The requests of ``route`` the origin logged."""
        logged = (json.loads(line) for line in list(self.origin.lines) if line.startswith("{"))
        return [r for r in logged if r.get("event") == "request" and r.get("route") == route]

    def origin_slices(self) -> int:
        """Blob requests the origin answered: each one a slice the cache fetched."""
        return len(self.origin_requests(BLOB_ROUTE))


def rendered(cache_port: int, origin_port: int, cache_dir: Path) -> str:
    """deploy/nginx-cache.conf with loopback addresses and a private cache folder: nothing else
    of it changes."""
    text = CONFIG.read_text()
    text, listens = re.subn(r"listen 8080;", f"listen 127.0.0.1:{cache_port};", text)
    text, origins = re.subn(r"http://api:8000", f"http://127.0.0.1:{origin_port}", text)
    text, paths = re.subn(r"/var/cache/nginx/blobs", str(cache_dir), text)
    # Docker's embedded DNS only exists in compose; the origin here is an address.
    text, resolvers = re.subn(r"^resolver .*$", "", text, flags=re.MULTILINE)
    assert (listens, origins, paths, resolvers) == (1, 1, 1, 1)
    return text


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    data_dir = tmp_path_factory.mktemp("cache-origin") / "data"
    cache_port, origin_port = free_port(), free_port()
    cache = f"http://127.0.0.1:{cache_port}"
    origin = ServeProcess(
        data_dir=data_dir,
        port=origin_port,
        env={
            "TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN,
            "TENSOR_REGISTRY_LOG_LEVEL": "INFO",
            "TENSOR_REGISTRY_PUBLIC_URL": cache,
        },
    ).start()
    try:
        settings = Settings(
            data_dir=data_dir,
            database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
            storage={},  # type: ignore[arg-type]
            security={},  # type: ignore[arg-type]
        )
        registry = Registry(origin, TOKEN, settings, tmp_path_factory.mktemp("xdg"))
        site = rendered(cache_port, origin_port, tmp_path_factory.mktemp("nginx-cache"))
        with nginx.running(site, cache_port) as folder:
            yield Tier(cache, origin, registry, folder)
    finally:
        origin.stop()


@pytest.fixture(scope="module")
def weights(tier: Tier) -> tuple[str, bytes]:
    """A ready artifact whose model.tensors spans three cache slices; (its signed URL through
    the cache, its bytes)."""
    tier.registry.ready_model("fanout/llama")
    generator = torch.Generator().manual_seed(7)
    state = {"w": torch.randn(5_500_000, generator=generator)}  # 22 MB: three 8 MiB slices
    asyncio.run(make_artifact(tier.settings, model="fanout/llama", version=1, sources=[state]))
    with httpx.Client(base_url=tier.cache, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        answer = http.get("/api/v1/resolve", params={"model": "fanout/llama", "ref": "1"})
        assert answer.status_code == 200, answer.text
    file = next(f for f in answer.json()["files"] if f["path"] == "model.tensors")
    assert file["url"].startswith(f"{tier.cache}/api/v1/blobs/")
    with httpx.Client() as http:
        body = http.get(file["url"]).content
    assert hashlib.sha256(body).hexdigest() == file["sha256"] and len(body) == file["size"]
    return str(file["url"]), body


def _resigned(tier: Tier, url: str, *, ttl: int, now: float | None = None) -> str:
    """The same file under another signature (another node's resolve, or an expired one)."""
    path = httpx.URL(url).path
    key = path.removeprefix("/api/v1/blobs/local/")
    scope = "/".join(key.split("/")[:2]) + "/"
    signed = sign(
        tier.settings.signing_key_bytes(),
        purpose="blob",
        subject=f"local:{scope}",
        ttl=ttl,
        now=now,
    )
    return f"{tier.cache}{path}?{signed.query()}"


def test_nodes_share_the_cached_slices_whatever_their_signatures(
    tier: Tier, weights: tuple[str, bytes]
) -> None:
    url, body = weights
    sent, checks = tier.origin_slices(), len(tier.origin_requests(AUTH_ROUTE))
    assert sent == -(-len(body) // SLICE)  # the first node's pull: each slice once
    with httpx.Client() as http:
        for node in range(3):  # three more nodes, each with its own signature
            other = _resigned(tier, url, ttl=3600 + node)
            assert other != url
            got = http.get(other)
            assert got.status_code == 200 and got.content == body
            assert got.headers["x-cache-status"] == "HIT"
    assert tier.origin_slices() == sent  # the origin sent nothing more
    # ... yet the registry checked each request's signature (one call per slice, no bytes).
    new_checks = tier.origin_requests(AUTH_ROUTE)[checks:]
    assert len(new_checks) >= 3 and all(r["bytes_out"] == 0 for r in new_checks)


def test_a_range_through_the_cache_is_exact(tier: Tier, weights: tuple[str, bytes]) -> None:
    url, body = weights
    start, end = SLICE - 100, 2 * SLICE + 99  # across two slice boundaries
    with httpx.Client() as http:
        got = http.get(url, headers={"Range": f"bytes={start}-{end}"})
        head = http.head(url)
    assert got.status_code == 206
    assert got.content == body[start : end + 1]
    assert got.headers["content-range"] == f"bytes {start}-{end}/{len(body)}"
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(body)


def test_an_altered_or_expired_signature_is_refused_although_the_bytes_are_cached(
    tier: Tier, weights: tuple[str, bytes]
) -> None:
    url, body = weights
    expired = _resigned(tier, url, ttl=60, now=0)  # valid MAC, expired in 1970
    altered = url[:-3] + ("AAA" if not url.endswith("AAA") else "BBB")
    unsigned = url.split("?")[0]
    with httpx.Client() as http:
        assert http.get(url).headers["x-cache-status"] == "HIT"  # the bytes are cached
        for bad in (expired, altered, unsigned):
            refused = http.get(bad)
            assert refused.status_code == 403, bad
            assert body[:64] not in refused.content
            ranged = http.get(bad, headers={"Range": "bytes=0-99"})
            assert ranged.status_code == 403


def test_the_registry_checks_a_cached_request_without_moving_bytes(
    tier: Tier, weights: tuple[str, bytes]
) -> None:
    url, _ = weights
    target = url.removeprefix(tier.cache)
    origin = tier.origin.url
    with httpx.Client() as http:
        ok = http.get(f"{origin}/api/v1/blobs/auth", headers={"X-Original-URI": target})
        assert ok.status_code == 204 and ok.content == b""
        for bad, code in (
            (target.replace("sig=", "sig=x"), "signature_invalid"),
            ("/api/v1/models", "signature_invalid"),
            ("/api/v1/blobs/local/artifacts/x/y?exp=1&sig=" + "a" * 5000, "signature_invalid"),
            (_resigned(tier, url, ttl=60, now=0).removeprefix(tier.cache), "signature_expired"),
        ):
            refused = http.get(f"{origin}/api/v1/blobs/auth", headers={"X-Original-URI": bad})
            assert refused.status_code == 403 and refused.json()["code"] == code, bad
        missing = http.get(f"{origin}/api/v1/blobs/auth")
        assert missing.status_code == 403
