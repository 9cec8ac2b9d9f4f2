"""The cache tier never answers one path under another's signature (issue 33 §1).

A tenant holding a signed URL for its artifact A asked the real nginx tier for
``…/artifacts/<A>/../<B>/model.tensors?<A's signature>`` and got B's bytes from the cache: the
registry's auth check read the path as sent, nginx looked the normalised one up. Here B's bytes
are in the cache first, then every spelling that worked is sent as-is (no client-side
normalisation): each is refused at the edge, no byte of B goes out, and the origin refuses the
same paths too.
"""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import Iterator

import httpx
import pytest
import torch

from harness.artifacts import make_artifact
from tests.client.conftest import TOKEN
from tests.deploy.test_blob_cache import CONFIG, Tier, tier  # noqa: F401 - the real tier

SPELLINGS = (
    "{a}/../{b}/model.tensors",
    "{a}/%2e%2e/{b}/model.tensors",
    "{a}/%2E%2E/{b}/model.tensors",
    "{a}/..%2f{b}/model.tensors",
    "{a}%2f..%2f{b}/model.tensors",
    "{a}/./../{b}/model.tensors",
    "{a}//../../artifacts/{b}/model.tensors",
)


def _pair(on: Tier) -> Iterator[tuple[str, bytes]]:
    for model, seed in (("tenant-a/llama", 11), ("tenant-b/secret", 12)):
        on.registry.ready_model(model)
        generator = torch.Generator().manual_seed(seed)
        state = {"w": torch.randn(300_000, generator=generator)}
        asyncio.run(make_artifact(on.settings, model=model, version=1, sources=[state]))
        with httpx.Client(base_url=on.cache, headers={"Authorization": f"Bearer {TOKEN}"}) as h:
            answer = h.get("/api/v1/resolve", params={"model": model, "ref": "1"})
            assert answer.status_code == 200, answer.text
        file = next(f for f in answer.json()["files"] if f["path"] == "model.tensors")
        with httpx.Client() as h:
            body = h.get(file["url"]).content
        assert len(body) == file["size"]
        yield str(file["url"]), body


@pytest.fixture(scope="module")
def tenants(tier: Tier) -> tuple[str, bytes, str, bytes]:  # noqa: F811 - the imported fixture
    (url_a, body_a), (url_b, body_b) = _pair(tier)
    with httpx.Client() as h:  # B's bytes are in the cache
        again = h.get(url_b)
    assert again.status_code == 200 and again.headers["x-cache-status"] == "HIT"
    assert again.content == body_b
    return url_a, body_a, url_b, body_b


def _raw_get(base: str, target: str) -> tuple[int, bytes, str | None]:
    """GET ``target`` exactly as written (as `curl --path-as-is` sends it)."""
    url = httpx.URL(base)
    conn = http.client.HTTPConnection(url.host, url.port, timeout=60)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        return response.status, response.read(), response.getheader("x-cache-status")
    finally:
        conn.close()


def _artifact_id(url: str) -> str:
    """The id in ``/api/v1/blobs/local/artifacts/<id>/model.tensors``."""
    segments = httpx.URL(url).path.split("/")
    assert segments[5] == "artifacts" and len(segments[6]) == 36, url
    return segments[6]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_another_tenants_cached_bytes_never_answer_a_dotted_path(
    tier: Tier,  # noqa: F811
    tenants: tuple[str, bytes, str, bytes],
    spelling: str,
) -> None:
    url_a, body_a, url_b, body_b = tenants
    a, b = _artifact_id(url_a), _artifact_id(url_b)
    query = httpx.URL(url_a).query.decode()
    target = "/api/v1/blobs/local/artifacts/" + spelling.format(a=a, b=b) + "?" + query
    for base in (tier.cache, tier.origin.url):
        status, body, cache_status = _raw_get(base, target)
        assert status == 403, (base, target, status)
        assert body_b[:256] not in body and cache_status != "HIT", (base, target)
    # ... while the canonical URLs still answer, each with its own bytes.
    with httpx.Client() as h:
        got_a, got_b = h.get(url_a), h.get(url_b)
    assert got_a.status_code == 200 and got_a.content == body_a
    assert got_b.status_code == 200 and got_b.content == body_b


def test_the_auth_route_refuses_a_path_out_of_the_signed_scope(
    tier: Tier,  # noqa: F811
    tenants: tuple[str, bytes, str, bytes],
) -> None:
    url_a = tenants[0]
    a, query = _artifact_id(url_a), httpx.URL(url_a).query.decode()
    auth = f"{tier.origin.url}/api/v1/blobs/auth"
    with httpx.Client() as h:
        ok = h.get(auth, headers={"X-Original-URI": httpx.URL(url_a).raw_path.decode()})
        assert ok.status_code == 204
        for target in (
            f"/api/v1/blobs/local/artifacts/{a}/../../../../../etc/passwd?{query}",
            f"/api/v1/blobs/local/artifacts/{a}/%2e%2e/%2e%2e/%2e%2e/etc/passwd?{query}",
            f"/api/v1/blobs/local/artifacts/{a}//model.tensors?{query}",
            f"/api/v1/blobs/local/artifacts/{a}/model%2etensors?{query}",
        ):
            refused = h.get(auth, headers={"X-Original-URI": target})
            assert refused.status_code == 403, target
            assert refused.json()["code"] == "path_not_canonical", target


def test_the_cache_key_is_the_path_as_sent() -> None:
    """What the registry authorises (the raw request target's path) is what nginx caches under:
    never ``$uri``, which nginx decodes and normalises."""
    lines = CONFIG.read_text().splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert "proxy_cache_key $tensor_registry_blob_path$slice_range;" in text
    assert "map $request_uri $tensor_registry_blob_path {" in text
    assert "proxy_set_header X-Original-URI $request_uri;" in text
    assert "$uri" not in text.replace("$request_uri", "")
