"""Aliases: set, move with If-Match (races → 412), history, delete, ready versions only."""

from __future__ import annotations

import asyncio

import httpx

from tests.factories import create_model, ready_version


async def test_set_move_history_and_delete(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/llama")
    v1 = await ready_version(client, model["id"])
    v2 = await ready_version(client, model["id"])
    base = f"/api/v1/models/{model['id']}/aliases"

    created = await client.put(f"{base}/prod", json={"version": v1["version"]})
    assert created.status_code == 201
    assert created.json()["version"] == 1
    etag = created.headers["etag"]

    moved = await client.put(
        f"{base}/prod", json={"version": v2["version"]}, headers={"If-Match": etag}
    )
    assert moved.status_code == 200 and moved.json()["version"] == 2
    assert moved.headers["etag"] != etag
    assert [(h["from_version"], h["to_version"]) for h in moved.json()["history"]] == [
        (1, 2),
        (None, 1),
    ]

    listing = (await client.get(base)).json()
    assert [(a["alias"], a["version"]) for a in listing["items"]] == [("prod", 2)]

    stale = await client.delete(f"{base}/prod", headers={"If-Match": etag})
    assert stale.status_code == 412
    gone = await client.delete(f"{base}/prod", headers={"If-Match": moved.headers["etag"]})
    assert gone.status_code == 204
    assert (await client.get(f"{base}/prod")).json()["code"] == "alias_not_found"
    history = (await client.get(base)).json()["history"]
    assert [(h["from_version"], h["to_version"]) for h in history] == [(2, None), (1, 2), (None, 1)]


async def test_alias_race_one_wins_the_other_gets_412(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/llama")
    for _ in range(3):
        await ready_version(client, model["id"])
    url = f"/api/v1/models/{model['id']}/aliases/prod"
    etag = (await client.put(url, json={"version": 1})).headers["etag"]
    results = await asyncio.gather(
        client.put(url, json={"version": 2}, headers={"If-Match": etag}),
        client.put(url, json={"version": 3}, headers={"If-Match": etag}),
    )
    assert sorted(r.status_code for r in results) == [200, 412]
    winner = next(r for r in results if r.status_code == 200).json()["version"]
    assert (await client.get(url)).json()["version"] == winner
    loser = next(r for r in results if r.status_code == 412).json()
    assert loser["code"] in {"etag_mismatch", "precondition_failed"}


async def test_alias_needs_a_ready_version_and_a_valid_name(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/llama")
    await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    base = f"/api/v1/models/{model['id']}/aliases"
    draft = await client.put(f"{base}/prod", json={"version": 1})
    assert draft.status_code == 409 and draft.json()["code"] == "version_not_ready"
    missing = await client.put(f"{base}/prod", json={"version": 9})
    assert missing.status_code == 404 and missing.json()["code"] == "version_not_found"
    await ready_version(client, model["id"])
    assert (await client.put(f"{base}/latest", json={"version": 2})).json()[
        "code"
    ] == "alias_reserved"
    assert (await client.put(f"{base}/Prod!", json={"version": 2})).json()[
        "code"
    ] == "invalid_alias"
    assert (await client.put(f"{base}/7", json={"version": 2})).status_code == 422


async def test_version_behind_an_alias_cannot_be_deleted(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/llama")
    await ready_version(client, model["id"])
    await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})
    r = await client.delete(f"/api/v1/models/{model['id']}/versions/1")
    assert r.status_code == 409 and r.json()["code"] == "version_in_use"


async def test_a_matching_if_none_match_is_answered_304(client: httpx.AsyncClient) -> None:
    """Nodes polling an alias revalidate with its ETag: 304 without a body until it moves."""
    model = await create_model(client)
    await ready_version(client, model["id"])
    await ready_version(client, model["id"])
    route = f"/api/v1/models/{model['id']}/aliases/prod"
    await client.put(route, json={"version": 1})
    first = await client.get(route)
    etag = first.headers["etag"]
    for asked in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
        r = await client.get(route, headers={"If-None-Match": asked})
        assert (r.status_code, r.content, r.headers["etag"]) == (304, b"", etag), asked
    assert (await client.get(route, headers={"If-None-Match": '"0"'})).status_code == 200
    await client.put(route, json={"version": 2})
    moved = await client.get(route, headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.json()["version"] == 2
    assert moved.headers["etag"] != etag


async def test_an_alias_a_door_would_read_otherwise_is_refused(client: httpx.AsyncClient) -> None:
    """Issue 33 §5: `main` (the HF door's latest) and variant-form names (`prod.bfloat16.hf.tp1`
    is variant bfloat16.hf.tp1 of `prod` in the HF and OCI doors) would make one name answer
    different versions in /api/v1/resolve and the doors: refused, 422 alias_reserved."""
    model = await create_model(client, name="acme/doorname")
    await ready_version(client, model["id"])
    base = f"/api/v1/models/{model['id']}/aliases"
    for name in ("main", "prod.bfloat16.hf.tp1", "a.b.float16.vllm.tp2.enc", "x.float32.hf.tp8"):
        r = await client.put(f"{base}/{name}", json={"version": 1})
        assert r.status_code == 422 and r.json()["code"] == "alias_reserved", (name, r.text)
        assert "door" in r.json()["detail"], r.text
    # Names near the grammar that no door reads as a variant stay allowed.
    for name in ("mainline", "prod.bfloat16", "prod.bfloat16.hf.tp0", "prod.int8.hf.tp1"):
        r = await client.put(f"{base}/{name}", json={"version": 1})
        assert r.status_code == 201, (name, r.text)
    assert {a["alias"] for a in (await client.get(base)).json()["items"]} >= {"mainline"}
