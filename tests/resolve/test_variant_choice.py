"""Which artifact resolve hands out when several match: the filters given, then unencrypted
before encrypted, then the newest, for every caller (documented on the route and in README)."""

from __future__ import annotations

from typing import Any

import httpx

from harness.artifacts import make_artifact
from tensor_registry_server.settings import Settings
from tests.factories import auth, create_model, create_token, ready_version


async def _resolve(client: httpx.AsyncClient, token: str, **params: Any) -> httpx.Response:
    return await client.get(
        "/api/v1/resolve", params={"model": "acme/llama", **params}, headers=auth(token)
    )


async def test_adding_an_encrypted_variant_does_not_change_a_plain_resolve(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/llama")
    await ready_version(client, model["id"])
    plain = await make_artifact(settings, model="acme/llama", version=1, age_seconds=100)
    serving = await create_token(client, scopes=["resolve"], name="node")
    keyholder = await create_token(client, scopes=["resolve", "keys:read"], name="keys")

    before = await _resolve(client, serving)
    assert before.status_code == 200 and before.json()["artifact"]["id"] == str(plain.id)

    encrypted = await make_artifact(settings, model="acme/llama", version=1, encrypted=True)
    newer_encrypted = await make_artifact(
        settings, model="acme/llama", version=1, encrypted=True, dtype="float16"
    )

    # A token without keys:read gets the plain artifact, even though encrypted ones are newer.
    r = await _resolve(client, serving)
    assert r.status_code == 200, r.text
    assert r.json()["artifact"]["id"] == str(plain.id)
    assert r.json()["artifact"]["encryption"]["enabled"] is False
    assert r.json()["encryption_key_url"] is None

    # With keys:read and no filter: the same documented order, plain first.
    r = await _resolve(client, keyholder)
    assert r.json()["artifact"]["id"] == str(plain.id)

    # Asking for encrypted: the newest encrypted one, with its key URL for keys:read.
    r = await _resolve(client, keyholder, encrypted="true")
    assert r.json()["artifact"]["id"] == str(newer_encrypted.id)
    assert r.json()["encryption_key_url"]
    r = await _resolve(client, keyholder, encrypted="true", dtype="float32")
    assert r.json()["artifact"]["id"] == str(encrypted.id)
    r = await _resolve(client, keyholder, encrypted="false")
    assert r.json()["artifact"]["id"] == str(plain.id)

    # Without keys:read, an explicit encrypted=true still returns the artifact (the node
    # brings its own key file, as before), but never a key URL.
    r = await _resolve(client, serving, encrypted="true")
    assert r.status_code == 200
    assert r.json()["artifact"]["id"] == str(newer_encrypted.id)
    assert r.json()["encryption_key_url"] is None


async def test_a_miss_explains_how_resolve_chooses(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/llama")
    await ready_version(client, model["id"])
    await make_artifact(settings, model="acme/llama", version=1, encrypted=True)
    serving = await create_token(client, scopes=["resolve"], name="node")
    r = await _resolve(client, serving, encrypted="false")
    assert r.status_code == 404
    problem = r.json()
    assert problem["code"] == "no_matching_artifact"
    assert "unencrypted before encrypted" in problem["detail"]
    assert problem["available"][0]["encrypted"] is True
