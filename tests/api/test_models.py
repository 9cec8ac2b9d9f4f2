"""Models: names, filters, pagination, updates with If-Match, delete."""

from __future__ import annotations

import httpx
import pytest

from tests.factories import create_model


@pytest.mark.parametrize(
    "name",
    [
        "Acme/llama",
        "acme",
        "acme/llama/x",
        "acme/lla ma",
        "/llama",
        "acme/",
        "a/" + "x" * 127,
        "acme/..",
        "acme/llama%2f",
    ],
)
async def test_invalid_names_are_refused_with_validation_error(
    client: httpx.AsyncClient, name: str
) -> None:
    r = await client.post("/api/v1/models", json={"name": name})
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["code"] == "validation_error"
    assert body["request_id"] == r.headers["x-request-id"]


async def test_create_read_and_duplicate_name(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/api/v1/models",
        json={"name": "acme/llama-2-7b-chat", "description": "chat", "tags": ["llm", "chat"]},
    )
    assert r.status_code == 201
    model = r.json()
    assert r.headers["location"] == f"/api/v1/models/{model['id']}"
    assert model["tags"] == ["chat", "llm"]
    assert model["created_at"].endswith("Z")
    got = await client.get(f"/api/v1/models/{model['id']}")
    assert got.status_code == 200 and got.json()["name"] == "acme/llama-2-7b-chat"
    assert got.headers["etag"] == model["etag"]

    dup = await client.post("/api/v1/models", json={"name": "acme/llama-2-7b-chat"})
    assert dup.status_code == 409
    assert dup.json()["code"] == "name_taken"


async def test_filters_by_substring_tag_and_exact_name(client: httpx.AsyncClient) -> None:
    await create_model(client, name="acme/llama", description="Meta Llama", tags=["llm"])
    await create_model(client, name="acme/gpt2", description="small", tags=["llm", "tiny"])
    await create_model(client, name="other/bert", description="encoder", tags=["tiny"])

    async def names(**params: str) -> list[str]:
        r = await client.get("/api/v1/models", params=params)
        assert r.status_code == 200
        return [m["name"] for m in r.json()["items"]]

    assert await names(q="LLAMA") == ["acme/llama"]
    assert await names(q="small") == ["acme/gpt2"]
    assert await names(tag="tiny") == ["acme/gpt2", "other/bert"]
    assert await names(name="other/bert") == ["other/bert"]
    assert await names(q="%") == []


async def test_pagination_is_stable_under_inserts(client: httpx.AsyncClient) -> None:
    for i in range(0, 10, 2):
        await create_model(client, name=f"page/m{i}")
    first = (await client.get("/api/v1/models", params={"limit": 2})).json()
    assert [m["name"] for m in first["items"]] == ["page/m0", "page/m2"]
    assert first["next_cursor"]
    # Inserts before and after the cursor position.
    await create_model(client, name="page/m1")
    await create_model(client, name="page/m9")
    seen = [m["name"] for m in first["items"]]
    cursor = first["next_cursor"]
    while cursor:
        page = (await client.get("/api/v1/models", params={"limit": 2, "cursor": cursor})).json()
        seen += [m["name"] for m in page["items"]]
        cursor = page["next_cursor"]
    # Nothing repeated, nothing skipped that sorts after the cursor; m1 sorts before it.
    assert seen == ["page/m0", "page/m2", "page/m4", "page/m6", "page/m8", "page/m9"]


async def test_limit_bounds_and_bad_cursor(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/models", params={"limit": 501})).status_code == 422
    assert (await client.get("/api/v1/models", params={"limit": 0})).status_code == 422
    r = await client.get("/api/v1/models", params={"cursor": "!!!"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_cursor"


async def test_update_honours_if_match(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/llama")
    url = f"/api/v1/models/{model['id']}"
    ok = await client.patch(url, json={"description": "v2"}, headers={"If-Match": model["etag"]})
    assert ok.status_code == 200 and ok.json()["description"] == "v2"
    assert ok.headers["etag"] != model["etag"]
    stale = await client.patch(url, json={"tags": ["x"]}, headers={"If-Match": model["etag"]})
    assert stale.status_code == 412
    assert stale.json()["code"] == "etag_mismatch"
    assert (await client.get(url)).json()["tags"] == []
    # Tag-only change moves the ETag too.
    tags = await client.patch(url, json={"tags": ["x"]}, headers={"If-Match": ok.headers["etag"]})
    assert tags.status_code == 200 and tags.headers["etag"] != ok.headers["etag"]


async def test_unknown_fields_are_rejected(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v1/models", json={"name": "acme/x", "owner": "me"})
    assert r.status_code == 422


async def test_delete_model(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/gone")
    assert (await client.delete(f"/api/v1/models/{model['id']}")).status_code == 204
    r = await client.get(f"/api/v1/models/{model['id']}")
    assert r.status_code == 404 and r.json()["code"] == "model_not_found"
