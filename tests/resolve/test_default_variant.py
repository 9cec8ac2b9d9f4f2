"""An alias (or the model) names its default variant, so a new build never changes what a fleet
loads until someone says so; the resolve answer says which rule chose (issue 26 §7.4)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from harness.artifacts import make_artifact
from tensor_registry_server.settings import Settings
from tests.conftest import app_and_client
from tests.factories import create_model, ready_version
from tests.resolve.test_cache import REDIS_URL


async def _resolve(client: httpx.AsyncClient, **params: Any) -> httpx.Response:
    return await client.get("/api/v1/resolve", params={"model": "acme/fleet", **params})


async def _picked(client: httpx.AsyncClient, **params: Any) -> tuple[str, str]:
    r = await _resolve(client, **params)
    assert r.status_code == 200, r.text
    return str(r.json()["artifact"]["id"]), str(r.json()["chosen_by"])


async def test_a_new_build_does_not_change_what_an_alias_with_a_default_serves(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/fleet")
    await ready_version(client, model["id"])
    fp16 = await make_artifact(settings, model="acme/fleet", version=1, dtype="float16")
    alias = f"/api/v1/models/{model['id']}/aliases/prod"
    r = await client.put(alias, json={"version": 1, "default_variant": {"dtype": "float16"}})
    assert r.status_code == 201, r.text
    assert r.json()["default_variant"] == {
        "dtype": "float16",
        "format": None,
        "tensor_parallel_size": None,
        "encrypted": None,
    }
    assert await _picked(client, ref="prod") == (str(fp16.id), "alias_default")
    # Without a default the newest wins ("newest"): a new bf16 build would take over...
    bf16 = await make_artifact(settings, model="acme/fleet", version=1, dtype="bfloat16")
    assert await _picked(client, ref="1") == (str(bf16.id), "newest")
    # ... but prod keeps serving fp16, until someone says so.
    assert await _picked(client, ref="prod") == (str(fp16.id), "alias_default")
    # A request that names the variant wins over the default.
    assert await _picked(client, ref="prod", dtype="bfloat16") == (str(bf16.id), "request")
    # Moving the alias keeps its default (omitted: unchanged) ...
    r = await client.put(alias, json={"version": 1})
    assert r.json()["default_variant"]["dtype"] == "float16"
    # ... changing it is one PUT (audited), and null clears it.
    r = await client.put(alias, json={"version": 1, "default_variant": {"dtype": "bfloat16"}})
    assert r.status_code == 200 and r.json()["default_variant"]["dtype"] == "bfloat16"
    assert await _picked(client, ref="prod") == (str(bf16.id), "alias_default")
    r = await client.put(alias, json={"version": 1, "default_variant": None})
    assert r.json()["default_variant"] is None
    assert await _picked(client, ref="prod") == (str(bf16.id), "newest")
    audit = (await client.get("/api/v1/audit", params={"action": "alias.default_variant"})).json()
    assert [e["action"] for e in audit["items"]].count("alias.default_variant") == 2


async def test_the_model_default_applies_where_the_alias_says_nothing(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/fleet")
    await ready_version(client, model["id"])
    hf = await make_artifact(settings, model="acme/fleet", version=1, dtype="float16")
    tp2 = await make_artifact(
        settings,
        model="acme/fleet",
        version=1,
        dtype="float16",
        format="vllm",
        tensor_parallel_size=2,
    )
    r = await client.patch(
        f"/api/v1/models/{model['id']}",
        json={"default_variant": {"format": "hf", "tensor_parallel_size": 1}},
    )
    assert r.status_code == 200 and r.json()["default_variant"]["format"] == "hf"
    assert await _picked(client) == (str(hf.id), "model_default")
    assert await _picked(client, format="vllm", tensor_parallel_size=2) == (str(tp2.id), "request")
    # The defaults fill only what the request leaves out: vllm with the default's tp 1 is none.
    r = await _resolve(client, format="vllm")
    assert (r.status_code, r.json()["chosen_by"]) == (404, "model_default")
    # An alias's default applies whole, instead of the model's.
    alias = f"/api/v1/models/{model['id']}/aliases/prod"
    await client.put(alias, json={"version": 1, "default_variant": {"format": "vllm"}})
    assert await _picked(client, ref="prod") == (str(tp2.id), "alias_default")
    assert await _picked(client, ref="1") == (str(hf.id), "model_default")
    # A default no artifact matches is a 404 that says so, never another variant.
    await client.put(alias, json={"version": 1, "default_variant": {"dtype": "float32"}})
    r = await _resolve(client, ref="prod")
    assert (r.status_code, r.json()["code"]) == (404, "no_matching_artifact")
    assert r.json()["chosen_by"] == "alias_default"
    assert "alias default" in r.json()["detail"]
    # Bad defaults are refused.
    r = await client.put(alias, json={"version": 1, "default_variant": {"dtype": "int4"}})
    assert r.status_code == 422
    r = await client.patch(
        f"/api/v1/models/{model['id']}", json={"default_variant": {"colour": "blue"}}
    )
    assert r.status_code == 422


@pytest.fixture
def cached_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"broker": settings.broker.model_copy(update={"redis_url": REDIS_URL})}
    )


async def test_changing_a_default_is_seen_at_once_through_the_resolve_cache(
    cached_settings: Settings, settings: Settings, database_url: str
) -> None:
    """With the Redis resolve cache, a default's change invalidates like an alias move."""
    async with app_and_client(cached_settings) as (_, client):
        model = await create_model(client, name="acme/fleet")
        await ready_version(client, model["id"])
        fp16 = await make_artifact(settings, model="acme/fleet", version=1, dtype="float16")
        bf16 = await make_artifact(settings, model="acme/fleet", version=1, dtype="bfloat16")
        alias = f"/api/v1/models/{model['id']}/aliases/prod"
        await client.put(alias, json={"version": 1})
        for _ in range(3):
            seen = await _resolve(client, ref="prod")
        assert seen.headers["x-resolve-cache"] == "hit"
        assert seen.json()["artifact"]["id"] == str(bf16.id)
        await client.put(alias, json={"version": 1, "default_variant": {"dtype": "float16"}})
        after = await _resolve(client, ref="prod")
        assert after.headers["x-resolve-cache"] == "miss"
        assert (after.json()["artifact"]["id"], after.json()["chosen_by"]) == (
            str(fp16.id),
            "alias_default",
        )
        for _ in range(3):
            again = await _resolve(client, ref="prod")
        assert again.headers["x-resolve-cache"] == "hit"
        assert again.json()["chosen_by"] == "alias_default"
