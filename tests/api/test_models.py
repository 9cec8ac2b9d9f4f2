"""Models: names, filters, pagination, updates with If-Match, delete."""

from __future__ import annotations

import httpx
import pytest

from tensor_registry_server.settings import Settings
from tests.factories import create_model, ready_version


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


async def test_list_and_read_carry_a_summary_of_versions_aliases_and_variants(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    from harness.artifacts import make_artifact

    busy = await create_model(client, name="acme/busy")
    empty = await create_model(client, name="acme/empty")
    await ready_version(client, busy["id"])
    v2 = await ready_version(client, busy["id"])
    assert (await client.post(f"/api/v1/models/{busy['id']}/versions", json={})).status_code == 201
    for alias, number in (("prod", 1), ("staging", 2)):
        r = await client.put(
            f"/api/v1/models/{busy['id']}/aliases/{alias}", json={"version": number}
        )
        assert r.status_code == 201, r.text
    await make_artifact(settings, model="acme/busy", version=1)
    await make_artifact(settings, model="acme/busy", version=2, dtype="bfloat16")
    await make_artifact(settings, model="acme/busy", version=2, format="vllm", status="failed")

    listed = {m["name"]: m for m in (await client.get("/api/v1/models")).json()["items"]}
    expected = {
        "latest_version": 2,
        "latest_size": v2["size"],
        "version_count": 3,
        "aliases": {"prod": 1, "staging": 2},
        "variant_count": 2,
    }
    assert listed["acme/busy"]["summary"] == expected
    assert listed["acme/empty"]["summary"] == {
        "latest_version": None,
        "latest_size": None,
        "version_count": 0,
        "aliases": {},
        "variant_count": 0,
    }
    read = (await client.get(f"/api/v1/models/{busy['id']}")).json()
    assert read["summary"] == expected
    empty_read = (await client.get(f"/api/v1/models/{empty['id']}")).json()
    assert empty_read["summary"]["version_count"] == 0


async def test_the_list_summary_costs_the_same_queries_for_one_model_or_fifty(
    client: httpx.AsyncClient, app: object
) -> None:
    from sqlalchemy import event

    engine = app.state.engine  # type: ignore[attr-defined]
    statements: list[str] = []

    def count(*args: object) -> None:
        # Only the summary's statements: auth and the page itself are not what is measured.
        sql = str(args[2])
        if any(f"FROM {table}" in sql for table in ("versions", "aliases", "artifacts")):
            statements.append(sql)

    async def queries_for_list() -> int:
        statements.clear()
        event.listen(engine.sync_engine, "before_cursor_execute", count)
        try:
            assert (await client.get("/api/v1/models?limit=500")).status_code == 200
        finally:
            event.remove(engine.sync_engine, "before_cursor_execute", count)
        return len(statements)

    first = await create_model(client, name="acme/m-00")
    await ready_version(client, first["id"])
    one = await queries_for_list()
    for i in range(1, 50):
        await create_model(client, name=f"acme/m-{i:02d}")
    assert one == 4
    assert await queries_for_list() == one
