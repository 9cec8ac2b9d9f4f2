"""Issue 33 §5: a malformed punycode host is a 422 wherever a URL is taken (it was a 500 from
httpx's lazy IDNA decoding), and every integer parameter is bounded in the schema (a fuzzer's
`?version=6359390722698988973195264` went past the database's integer range: a 500)."""

from __future__ import annotations

import httpx
import pytest

from tests.factories import create_model, ready_version

BAD_HOSTS = ["https://xn--/", "https://xn--/model.tensors"]
HUGE = "6359390722698988973195264"


@pytest.mark.parametrize("url", BAD_HOSTS)
async def test_a_malformed_punycode_host_is_422_everywhere_a_url_is_taken(
    client: httpx.AsyncClient, url: str
) -> None:
    model = await create_model(client)
    await ready_version(client, model["id"])
    created = await client.post(
        "/api/v1/webhooks", json={"namespace": model["name"].split("/")[0], "url": url}
    )
    assert created.status_code == 422, created.text
    good = await client.post(
        "/api/v1/webhooks",
        json={"namespace": model["name"].split("/")[0], "url": "https://hooks.example/in"},
    )
    assert good.status_code == 201, good.text
    patched = await client.patch(f"/api/v1/webhooks/{good.json()['id']}", json={"url": url})
    assert patched.status_code == 422, patched.text
    imported = await client.post(f"/api/v1/models/{model['id']}/versions", json={"source_uri": url})
    assert imported.status_code == 422, imported.text
    registered = await client.post(
        f"/api/v1/models/{model['id']}/artifacts",
        json={"version": 1, "dtype": "bfloat16", "format": "hf", "uri": url},
    )
    assert registered.status_code == 422, registered.text
    for r in (created, patched, imported, registered):
        assert r.json()["status"] == 422 and r.json()["code"] != "internal_error", r.text


async def test_integers_past_the_databases_range_are_422(client: httpx.AsyncClient) -> None:
    model = await create_model(client)
    await ready_version(client, model["id"])
    for path, params in [
        (f"/api/v1/models/{model['id']}/artifacts", {"version": HUGE}),
        (f"/api/v1/models/{model['id']}/artifacts", {"version": str(2**31)}),
        ("/api/v1/resolve", {"model": model["name"], "ttl": HUGE}),
        ("/api/v1/events", {"after": HUGE}),
        (f"/api/v1/models/{model['id']}/versions/{HUGE}", {}),
    ]:
        r = await client.get(path, params=params)
        assert r.status_code == 422, (path, params, r.text)


async def test_every_integer_parameter_is_bounded_in_the_schema(
    client: httpx.AsyncClient,
) -> None:
    spec = (await client.get("/openapi.json")).json()
    unbounded = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                for choice in [schema, *schema.get("anyOf", [])]:
                    if choice.get("type") == "integer" and not (
                        "minimum" in choice and "maximum" in choice
                    ):
                        unbounded.append(f"{method} {path} {parameter['name']}")
    assert unbounded == []
