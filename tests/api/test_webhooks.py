"""Webhooks on SQLite and PostgreSQL: a receiver on 127.0.0.1 verifies every delivery with the
Standard Webhooks library; retries back off on an injected clock; the delivery log records
each try; redelivery by hand; automatic disable with its event; the secret is shown once and
stored wrapped; internal addresses are refused unless allow-listed."""

from __future__ import annotations

import base64
import queue
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from standardwebhooks import Webhook as StandardWebhook

from harness.loopback import QuietHandler, serving
from harness.waiting import poll_async
from tensor_registry_server.core.addresses import AllowList
from tensor_registry_server.core.events_outbox import read_after
from tensor_registry_server.core.fetch import FetchPolicy
from tensor_registry_server.rows.webhooks import Webhook
from tensor_registry_server.settings import Settings
from tensor_registry_server.webhooks.delivery import Deliverer
from tests.factories import auth, create_model, create_token, ready_version


@dataclass
class Receiver:
    """A webhook receiver: answers with the queued status codes (then 200) and keeps every
    request it got (headers, body)."""

    url: str = ""
    answers: queue.Queue[int] = field(default_factory=queue.Queue)
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return list(self.got)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with state.lock:
                state.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
            try:
                code = state.answers.get_nowait()
            except queue.Empty:
                code = 200
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    with serving(Handler) as url:
        state.url = url + "/hook"
        yield state


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Loopback allow-listed explicitly (the receiver runs there); the tests drive the delivery
    loop themselves, on their own clock."""
    settings.fetch.allow = ["127.0.0.1"]
    settings.webhooks.deliver = False
    settings.webhooks.retry_base_seconds = 5
    return settings


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def _hook(client: httpx.AsyncClient, url: str, **body: Any) -> dict[str, Any]:
    r = await client.post("/api/v1/webhooks", json={"namespace": "acme", "url": url, **body})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/api/v1/webhooks/{r.json()['id']}"
    return dict(r.json())


async def _move(client: httpx.AsyncClient, model_id: str, version: int) -> None:
    r = await client.put(f"/api/v1/models/{model_id}/aliases/prod", json={"version": version})
    assert r.status_code in (200, 201), r.text


async def _deliveries(client: httpx.AsyncClient, hook_id: str) -> list[dict[str, Any]]:
    r = await client.get(f"/api/v1/webhooks/{hook_id}/deliveries")
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def _verify(secret: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    return dict(StandardWebhook(secret).verify(body, headers))


async def test_alias_move_is_delivered_signed_to_a_verifying_receiver(
    client: httpx.AsyncClient, app: Any, settings: Settings, receiver: Receiver
) -> None:
    """The delivery loop as the API runs it (real clock), end to end."""
    model = await create_model(client, name="acme/hooked")
    await ready_version(client, model["id"])
    hook = await _hook(client, receiver.url, events=["alias.moved"])
    assert hook["secret"].startswith("whsec_")
    deliverer = Deliverer(app.state.sessionmaker, settings)
    deliverer.start(app.state.event_hub)
    try:
        await _move(client, model["id"], 1)

        async def received() -> list[tuple[dict[str, str], bytes]]:
            return receiver.received()

        [(headers, body)] = await poll_async(received, what="the webhook delivery", timeout=30)

        async def recorded() -> list[dict[str, Any]]:
            return [d for d in await _deliveries(client, hook["id"]) if d["status"] != "pending"]

        [delivery] = await poll_async(recorded, what="the delivery's record", timeout=30)
    finally:
        await deliverer.close()
    payload = _verify(hook["secret"], headers, body)
    assert payload["type"] == "alias.moved"
    assert payload["data"]["model"] == "acme/hooked" and payload["data"]["to_version"] == 1
    assert headers["webhook-id"] == f"evt_{payload['id']}"
    # A forged body fails verification with the library.
    with pytest.raises(Exception, match=r"(?i)signature"):
        _verify(hook["secret"], headers, body.replace(b"acme/hooked", b"acme/forged"))
    assert delivery["status"] == "succeeded" and delivery["last_status_code"] == 200
    assert delivery["event_type"] == "alias.moved" and delivery["event_id"] == int(payload["id"])
    [attempt] = delivery["attempt_log"]
    assert attempt["status_code"] == 200 and attempt["duration_ms"] >= 0


async def test_failed_tries_back_off_with_jitter_then_succeed(
    client: httpx.AsyncClient, app: Any, settings: Settings, receiver: Receiver
) -> None:
    model = await create_model(client, name="acme/retry")
    await ready_version(client, model["id"])
    hook = await _hook(client, receiver.url)
    await _move(client, model["id"], 1)
    receiver.answers.put(500)
    receiver.answers.put(503)
    clock = Clock()
    deliverer = Deliverer(app.state.sessionmaker, settings, clock=clock)
    assert await deliverer.match() == 1
    assert await deliverer.deliver_due() == 1  # 500
    [d] = await _deliveries(client, hook["id"])
    assert d["status"] == "pending" and d["attempts"] == 1 and d["last_status_code"] == 500
    wait = (datetime.fromisoformat(d["next_attempt_at"]) - clock.now).total_seconds()
    assert 2.5 <= wait <= 5.0  # base 5 s, jitter in [0.5, 1]
    assert await deliverer.deliver_due() == 0  # not due yet
    clock.advance(wait)
    assert await deliverer.deliver_due() == 1  # 503
    [d] = await _deliveries(client, hook["id"])
    wait = (datetime.fromisoformat(d["next_attempt_at"]) - clock.now).total_seconds()
    assert 5.0 <= wait <= 10.0  # doubled
    clock.advance(wait)
    assert await deliverer.deliver_due() == 1  # 200
    [d] = await _deliveries(client, hook["id"])
    assert d["status"] == "succeeded" and d["attempts"] == 3
    assert [a["status_code"] for a in d["attempt_log"]] == [500, 503, 200]
    got = receiver.received()
    assert len({h["webhook-id"] for h, _ in got}) == 1  # the same message each time
    for headers, body in got:
        _verify(hook["secret"], headers, body)
    assert (await client.get(f"/api/v1/webhooks/{hook['id']}")).json()["consecutive_failures"] == 0


async def test_redelivery_by_hand(
    client: httpx.AsyncClient, app: Any, settings: Settings, receiver: Receiver
) -> None:
    model = await create_model(client, name="acme/again")
    await ready_version(client, model["id"])
    hook = await _hook(client, receiver.url)
    await _move(client, model["id"], 1)
    clock = Clock()
    deliverer = Deliverer(app.state.sessionmaker, settings, clock=clock)
    await deliverer.match()
    await deliverer.deliver_due()
    [d] = await _deliveries(client, hook["id"])
    assert d["status"] == "succeeded"
    assert await deliverer.deliver_due() == 0
    r = await client.post(f"/api/v1/webhooks/{hook['id']}/deliveries/{d['id']}/redeliver")
    assert r.status_code == 202 and r.json()["status"] == "pending"
    clock.advance(1)  # the route stamps "due now" on the real clock
    assert await deliverer.deliver_due() == 1
    [d] = await _deliveries(client, hook["id"])
    assert d["status"] == "succeeded" and len(d["attempt_log"]) == 2
    (first, _), (second, body) = receiver.received()
    assert first["webhook-id"] == second["webhook-id"]
    _verify(hook["secret"], second, body)
    missing = await client.post(
        f"/api/v1/webhooks/{hook['id']}/deliveries/{uuid.uuid4()}/redeliver"
    )
    assert missing.status_code == 404 and missing.json()["code"] == "delivery_not_found"


async def test_repeated_failures_disable_the_webhook_with_an_event(
    client: httpx.AsyncClient, app: Any, settings: Settings, receiver: Receiver
) -> None:
    settings.webhooks.disable_after_failures = 3
    settings.webhooks.max_attempts = 2
    model = await create_model(client, name="acme/down")
    await ready_version(client, model["id"])
    await ready_version(client, model["id"])
    hook = await _hook(client, receiver.url, events=["alias.moved"])
    await _move(client, model["id"], 1)
    await _move(client, model["id"], 2)
    for _ in range(10):
        receiver.answers.put(500)
    clock = Clock()
    deliverer = Deliverer(app.state.sessionmaker, settings, clock=clock)
    assert await deliverer.match() == 2
    assert await deliverer.deliver_due() == 2  # failures 1, 2
    clock.advance(3600)
    assert await deliverer.deliver_due() == 2  # failures 3 (disables), 4 (already taken)
    state = (await client.get(f"/api/v1/webhooks/{hook['id']}")).json()
    assert state["enabled"] is False and "3 consecutive" in state["disabled_reason"]
    assert sorted(d["status"] for d in await _deliveries(client, hook["id"])) == [
        "failed",
        "failed",
    ]
    async with app.state.sessionmaker() as session:
        events = await read_after(session, 0)
    disabled = [e for e in events if e.type == "webhook.disabled"]
    assert len(disabled) == 1 and disabled[0].data["webhook_id"] == hook["id"]
    assert disabled[0].namespace == "acme"
    # Disabled: new events are recorded but not sent.
    await _move(client, model["id"], 1)
    await deliverer.match()
    clock.advance(3600)
    sent = len(receiver.received())
    assert await deliverer.deliver_due() == 0 and len(receiver.received()) == sent
    # Enabled by hand: the waiting delivery goes out.
    r = await client.patch(f"/api/v1/webhooks/{hook['id']}", json={"enabled": True})
    assert r.status_code == 200 and r.json()["enabled"] is True
    assert await deliverer.deliver_due() == 1
    assert receiver.received()[-1][0]["webhook-id"] != receiver.received()[0][0]["webhook-id"]


async def test_secret_is_shown_once_and_stored_wrapped(
    client: httpx.AsyncClient, app: Any, receiver: Receiver
) -> None:
    hook = await _hook(client, receiver.url)
    shown = (await client.get(f"/api/v1/webhooks/{hook['id']}")).json()
    assert "secret" not in shown and shown["url"] == receiver.url
    listing = (await client.get("/api/v1/webhooks")).text
    assert hook["secret"] not in listing
    async with app.state.sessionmaker() as session:
        row = (await session.execute(select(Webhook))).scalars().one()
    raw = base64.b64decode(hook["secret"].removeprefix("whsec_"))
    assert len(raw) == 32 and raw not in row.secret_wrapped


async def test_webhooks_are_namespace_scoped(client: httpx.AsyncClient, receiver: Receiver) -> None:
    hook = await _hook(client, receiver.url)
    other = await create_token(client, scopes=["models:read", "models:write"], namespaces=["other"])
    refused = await client.post(
        "/api/v1/webhooks",
        json={"namespace": "acme", "url": receiver.url},
        headers=auth(other),
    )
    assert refused.status_code == 403 and refused.json()["code"] == "namespace_forbidden"
    assert (
        await client.get(f"/api/v1/webhooks/{hook['id']}", headers=auth(other))
    ).status_code == 404
    assert (await client.get("/api/v1/webhooks", headers=auth(other))).json()["items"] == []
    reader = await create_token(client, scopes=["models:read"], namespaces=["acme"])
    r = await client.delete(f"/api/v1/webhooks/{hook['id']}", headers=auth(reader))
    assert r.status_code == 403
    bad = await client.post(
        "/api/v1/webhooks", json={"namespace": "acme", "url": receiver.url, "events": ["x.y"]}
    )
    assert bad.status_code == 422 and bad.json()["code"] == "unknown_event_type"
    assert (await client.delete(f"/api/v1/webhooks/{hook['id']}")).status_code == 204
    assert (await client.get(f"/api/v1/webhooks/{hook['id']}")).status_code == 404


async def test_events_of_other_namespaces_and_types_are_not_sent(
    client: httpx.AsyncClient, app: Any, settings: Settings, receiver: Receiver
) -> None:
    mine = await create_model(client, name="acme/mine")
    theirs = await create_model(client, name="other/theirs")
    hook = await _hook(client, receiver.url, events=["alias.moved"])
    await ready_version(client, mine["id"])  # version.ready: not subscribed
    await ready_version(client, theirs["id"])
    await _move(client, theirs["id"], 1)  # another namespace
    await _move(client, mine["id"], 1)
    deliverer = Deliverer(app.state.sessionmaker, settings, clock=Clock())
    assert await deliverer.match() == 1
    assert await deliverer.match() == 0  # the cursor moved: nothing twice
    await deliverer.deliver_due()
    [(headers, body)] = receiver.received()
    assert _verify(hook["secret"], headers, body)["data"]["model"] == "acme/mine"


# -- the attacker's side -----------------------------------------------------------------------
async def test_internal_addresses_are_refused_by_default(
    client: httpx.AsyncClient, app: Any, settings: Settings, receiver: Receiver
) -> None:
    """Without the allow-list a webhook cannot aim the registry at its own network: a literal
    internal address is refused at creation, and a name that resolves to one is refused at
    delivery (DNS checked every time), so the internal service never sees a request."""
    settings.fetch.allow = []
    for url in (receiver.url, "http://169.254.169.254/latest/meta-data", "http://localhost:1/"):
        r = await client.post("/api/v1/webhooks", json={"namespace": "acme", "url": url})
        assert r.status_code == 422 and r.json()["code"] == "webhook_url_refused", url

    port = httpx.URL(receiver.url).port
    hook = await _hook(client, f"http://hooks.example.test:{port}/hook", events=["alias.moved"])
    model = await create_model(client, name="acme/rebind")
    await ready_version(client, model["id"])
    await _move(client, model["id"], 1)
    policy = FetchPolicy(allow=AllowList.parse([]), resolver=lambda host, port: ["127.0.0.1"])
    deliverer = Deliverer(app.state.sessionmaker, settings, policy=policy, clock=Clock())
    await deliverer.match()
    assert await deliverer.deliver_due() == 1
    [d] = await _deliveries(client, hook["id"])
    assert d["status"] == "pending" and d["last_error"] == "refused"
    assert d["last_status_code"] is None
    assert receiver.received() == []


async def test_old_events_and_finished_deliveries_are_pruned(
    client: httpx.AsyncClient, app: Any, settings: Settings, receiver: Receiver
) -> None:
    model = await create_model(client, name="acme/old")
    await ready_version(client, model["id"])
    hook = await _hook(client, receiver.url, events=["alias.moved"])
    await _move(client, model["id"], 1)
    clock = Clock()
    deliverer = Deliverer(app.state.sessionmaker, settings, clock=clock)
    await deliverer.match()
    await deliverer.deliver_due()
    async with app.state.sessionmaker() as session:
        assert await read_after(session, 0)
    # Nothing is younger than the cut-off: every event goes, and the finished delivery.
    assert await deliverer.prune(datetime.now(UTC) + timedelta(minutes=1)) == 2
    async with app.state.sessionmaker() as session:
        assert await read_after(session, 0) == []
    assert await _deliveries(client, hook["id"]) == []


async def test_answers_show_a_webhooks_url_redacted(client: httpx.AsyncClient) -> None:
    """Issue 33 §5: a read-only token saw user:password and query tokens of webhook URLs in
    full; answers now show them as events and logs do (scheme://host/path)."""
    secret_url = "https://hook-user:hook-pass@hooks.example/in?token=qs-secret#frag"
    hook = await _hook(client, secret_url)
    reader = await create_token(client, scopes=["models:read"], namespaces=["acme"])
    for r in (
        await client.get("/api/v1/webhooks", headers=auth(reader)),
        await client.get(f"/api/v1/webhooks/{hook['id']}", headers=auth(reader)),
        await client.get(f"/api/v1/webhooks/{hook['id']}"),
        await client.patch(f"/api/v1/webhooks/{hook['id']}", json={"description": "d"}),
    ):
        assert r.status_code == 200, r.text
        assert "hooks.example/in" in r.text, r.text
        for part in ("hook-user", "hook-pass", "qs-secret", "frag"):
            assert part not in r.text, (part, r.text)
    assert hook["url"] == "https://hooks.example/in"
