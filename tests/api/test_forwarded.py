"""Which client address is logged and audited: the TCP peer, unless the peer is a configured
proxy (``security.trusted_proxies``); X-Forwarded-For from anyone else is ignored."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from harness.artifacts import make_artifact
from tensor_registry_server.main import create_app
from tensor_registry_server.settings import Settings
from tests.conftest import ADMIN_TOKEN
from tests.factories import auth, create_model, create_token, ready_version


@pytest.mark.parametrize(
    ("trusted", "peer", "forwarded", "expected"),
    [
        # The default: no proxy is trusted, not even a loopback peer.
        ([], "127.0.0.1", "203.0.113.9", "127.0.0.1"),
        (["10.0.0.0/8"], "192.0.2.50", "203.0.113.9", "192.0.2.50"),
        (["127.0.0.1"], "127.0.0.1", "203.0.113.9", "203.0.113.9"),
        # The right-most hop that is not a trusted proxy; what the client wrote left of it is
        # not believed.
        (
            ["127.0.0.1", "10.0.0.0/8"],
            "127.0.0.1",
            "198.51.100.1, 203.0.113.9, 10.0.0.2",
            "203.0.113.9",
        ),
        (["127.0.0.1"], "127.0.0.1", "not-an-address", "127.0.0.1"),
    ],
)
async def test_key_fetches_are_logged_and_audited_with_the_real_client_address(
    client: httpx.AsyncClient,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
    trusted: list[str],
    peer: str,
    forwarded: str,
    expected: str,
) -> None:
    model = await create_model(client, name="acme/llama")
    await ready_version(client, model["id"])
    await make_artifact(settings, model="acme/llama", version=1, encrypted=True)
    token = await create_token(client, scopes=["resolve", "keys:read"])
    resolved = await client.get(
        "/api/v1/resolve", params={"model": "acme/llama"}, headers=auth(token)
    )
    key_url = resolved.json()["encryption_key_url"]

    settings.security.trusted_proxies = trusted
    behind = create_app(settings)
    caplog.set_level(logging.INFO, logger="tensor_registry.access")
    async with behind.router.lifespan_context(behind):
        transport = httpx.ASGITransport(app=behind, client=(peer, 40000))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as node:
            fetched = await node.get(key_url, headers={"X-Forwarded-For": forwarded})
            assert fetched.status_code == 200 and len(fetched.content) == 32
            audit = await node.get(
                "/api/v1/audit",
                params={"action": "key.fetch"},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            )
    [event] = audit.json()["items"]
    assert event["detail"]["client"] == expected
    lines = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == "tensor_registry.access"
    ]
    [line] = [entry for entry in lines if entry["path"].startswith("/api/v1/keys/")]
    assert line["client"] == expected
