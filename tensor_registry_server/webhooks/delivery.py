"""The webhook delivery loop: it runs in every API process (``webhooks.deliver``).

Two steps, each safe to run in several replicas at once:

1. **Match**: for each webhook, the events past its ``cursor`` in its namespace (and of its
   types) become ``pending`` delivery rows; the cursor moves by compare-and-set in the same
   transaction, so two replicas never create a delivery twice (and the (webhook, event) pair is
   unique anyway). The outbox's ids are in commit order, so a cursor never skips an event.
2. **Deliver**: due deliveries (``pending``, ``next_attempt_at`` past, webhook enabled) are taken
   by compare-and-set on ``lease_until`` and POSTed through the guarded fetcher
   (tensor_registry_server/core/fetch.py: internal addresses refused unless allow-listed), signed
   per Standard
   Webhooks. A 2xx answer succeeds; anything else (another status, refused, unreachable, timed
   out) schedules a retry after ``base * 2**(n-1)`` seconds (capped) times a random factor in
   [0.5, 1] (jitter: a receiver that comes back is not hit by every replica at once), up to
   ``max_attempts``; then the delivery is ``failed`` (redeliverable by hand). After
   ``disable_after_failures`` consecutive failed tries the webhook is disabled and a
   ``webhook.disabled`` event is written in the same transaction.

Every try is logged on the delivery (time, status code, duration, error kind). The clock and
the random source are injected, so tests step through the schedule without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tensor_registry_server.core.db import session_scope, utcnow
from tensor_registry_server.core.event_hub import EventHub
from tensor_registry_server.core.events_outbox import Event, emit, newest_id, to_record
from tensor_registry_server.core.events_outbox import prune as prune_events
from tensor_registry_server.core.fetch import FetchError, FetchPolicy, post_async
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.rows.webhooks import DeliveryStatus, Webhook, WebhookDelivery
from tensor_registry_server.settings import Settings
from tensor_registry_server.webhooks import signing
from tensor_registry_server.webhooks.service import secret_of

log = logging.getLogger("tensor_registry.webhooks")

Clock = Callable[[], datetime]
MATCH_BATCH = 1000
DELIVER_BATCH = 50
PARALLEL = 8
IDLE_WAKE_SECONDS = 5.0
KEPT_ATTEMPTS = 50
PRUNE_EVERY_SECONDS = 3600.0


class Deliverer:
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        *,
        policy: FetchPolicy | None = None,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._settings = settings
        self._config = settings.webhooks
        base = policy or FetchPolicy.from_settings(settings)
        timeout = self._config.timeout_seconds
        self._policy = replace(
            base,
            total_seconds=timeout,
            connect_seconds=min(base.connect_seconds, timeout),
            read_seconds=min(base.read_seconds, timeout),
        )
        self._clock = clock
        self._rng = rng or random.Random()
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def backoff_seconds(self, attempts: int) -> float:
        """The wait after the ``attempts``-th failed try."""
        ceiling = min(
            self._config.retry_max_seconds, self._config.retry_base_seconds * 2 ** (attempts - 1)
        )
        return ceiling * (0.5 + 0.5 * self._rng.random())

    # -- the loop ----------------------------------------------------------------------------
    def start(self, hub: EventHub) -> None:
        self._task = asyncio.create_task(self.run(hub), name="webhook-deliveries")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def kick(self) -> None:
        """Look for due deliveries now (a redelivery by hand)."""
        self._kick.set()

    async def run(self, hub: EventHub) -> None:
        seen = hub.newest
        failures = 0
        pruned_at = 0.0
        while True:
            self._kick.clear()
            try:
                seen = hub.newest
                await self.match()
                await self.deliver_due()
                if time.monotonic() - pruned_at > PRUNE_EVERY_SECONDS:
                    retention = timedelta(days=self._settings.events.retention_days)
                    await self.prune(self._clock() - retention)
                    pruned_at = time.monotonic()
                wait = await self._seconds_to_next_due()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.warning("webhook deliveries: a round failed", exc_info=True)
                wait = min(30.0, 0.5 * 2**failures)
            await self._wait(hub, seen, wait)

    async def _wait(self, hub: EventHub, seen: int, seconds: float) -> None:
        if seconds <= 0:
            return
        waits = {
            asyncio.create_task(hub.wait(seen, seconds)),
            asyncio.create_task(self._kick.wait()),
        }
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def prune(self, older_than: datetime) -> int:
        """Delete the events and the finished deliveries created before ``older_than``."""
        async with session_scope(self._sessionmaker) as session:
            await session.execute(
                delete(WebhookDelivery).where(
                    WebhookDelivery.created_at < older_than,
                    WebhookDelivery.status != DeliveryStatus.PENDING,
                )
            )
            return await prune_events(session, older_than)

    async def _seconds_to_next_due(self) -> float:
        async with self._sessionmaker() as session:
            due = await session.scalar(
                select(func.min(WebhookDelivery.next_attempt_at))
                .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
                .where(WebhookDelivery.status == DeliveryStatus.PENDING, Webhook.enabled)
            )
        if due is None:
            return IDLE_WAKE_SECONDS
        return max(0.05, min(IDLE_WAKE_SECONDS, (due - self._clock()).total_seconds()))

    # -- step 1: events → deliveries -----------------------------------------------------------
    async def match(self) -> int:
        """Create the pending deliveries of every webhook's new events; returns how many."""
        async with self._sessionmaker() as session:
            newest = await newest_id(session)
            hooks = (
                await session.execute(
                    select(Webhook.id, Webhook.cursor).where(Webhook.cursor < newest)
                )
            ).all()
        created = 0
        for webhook_id, cursor in hooks:
            created += await self._match_one(webhook_id, cursor, newest)
        return created

    async def _match_one(self, webhook_id: uuid.UUID, cursor: int, newest: int) -> int:
        async with session_scope(self._sessionmaker) as session:
            webhook = await session.get(Webhook, webhook_id)
            if webhook is None or webhook.cursor != cursor:
                return 0
            stmt = select(Event.id, Event.type).where(
                Event.id > cursor, Event.id <= newest, Event.namespace == webhook.namespace
            )
            if webhook.event_types:
                stmt = stmt.where(Event.type.in_(webhook.event_types))
            events = (await session.execute(stmt.order_by(Event.id).limit(MATCH_BATCH))).all()
            upto = events[-1][0] if len(events) == MATCH_BATCH else newest
            moved = await session.execute(
                update(Webhook)
                .where(Webhook.id == webhook_id, Webhook.cursor == cursor)
                .values(cursor=upto)
            )
            if moved.rowcount != 1:  # type: ignore[attr-defined]
                return 0  # another replica matched these events
            now = self._clock()
            if events:
                await session.execute(
                    insert(WebhookDelivery),
                    [
                        {
                            "id": uuid.uuid4(),
                            "webhook_id": webhook_id,
                            "event_id": event_id,
                            "event_type": event_type,
                            "status": DeliveryStatus.PENDING,
                            "attempts": 0,
                            "next_attempt_at": now,
                            "attempt_log": [],
                            "created_at": now,
                            "updated_at": now,
                        }
                        for event_id, event_type in events
                    ],
                )
            return len(events)

    # -- step 2: send what is due --------------------------------------------------------------
    async def deliver_due(self) -> int:
        """Send every due delivery this process can take; returns how many were tried."""
        now = self._clock()
        async with session_scope(self._sessionmaker) as session:
            candidates = (
                await session.scalars(
                    select(WebhookDelivery.id)
                    .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
                    .where(
                        WebhookDelivery.status == DeliveryStatus.PENDING,
                        WebhookDelivery.next_attempt_at <= now,
                        Webhook.enabled,
                        or_(
                            WebhookDelivery.lease_until.is_(None), WebhookDelivery.lease_until < now
                        ),
                    )
                    .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.event_id)
                    .limit(DELIVER_BATCH)
                )
            ).all()
            taken = []
            lease = now + timedelta(seconds=self._config.lease_seconds)
            for delivery_id in candidates:
                claimed = await session.execute(
                    update(WebhookDelivery)
                    .where(
                        WebhookDelivery.id == delivery_id,
                        WebhookDelivery.status == DeliveryStatus.PENDING,
                        or_(
                            WebhookDelivery.lease_until.is_(None),
                            WebhookDelivery.lease_until < now,
                        ),
                    )
                    .values(lease_until=lease)
                )
                if claimed.rowcount == 1:  # type: ignore[attr-defined]
                    taken.append(delivery_id)
        limit = asyncio.Semaphore(PARALLEL)

        async def one(delivery_id: uuid.UUID) -> None:
            async with limit:
                await self._deliver(delivery_id)

        await asyncio.gather(*(one(d) for d in taken))
        return len(taken)

    async def _deliver(self, delivery_id: uuid.UUID) -> None:
        async with self._sessionmaker() as session:
            delivery = await session.get(WebhookDelivery, delivery_id)
            if delivery is None:
                return
            webhook = await session.get(Webhook, delivery.webhook_id)
            event = await session.get(Event, delivery.event_id)
        if webhook is None:
            return
        status_code: int | None = None
        error: str | None = None
        started = time.monotonic()
        if event is None:
            error = "event_pruned"
        else:
            body = json.dumps(to_record(event).payload(), separators=(",", ":")).encode()
            msg_id = f"evt_{event.id}"
            timestamp = int(self._clock().timestamp())
            headers = signing.headers(secret_of(webhook, self._settings), msg_id, timestamp, body)
            try:
                status_code = await post_async(
                    webhook.url, self._policy, content=body, headers=headers
                )
            except FetchError as exc:
                error = exc.reason
            except Exception as exc:  # a bug or the unexpected: logged, counted as a failure
                log.warning("webhook %s: delivery failed", webhook.id, exc_info=True)
                error = type(exc).__name__
        duration_ms = int((time.monotonic() - started) * 1000)
        await self._record(delivery_id, webhook.id, status_code, error, duration_ms)

    async def _record(
        self,
        delivery_id: uuid.UUID,
        webhook_id: uuid.UUID,
        status_code: int | None,
        error: str | None,
        duration_ms: int,
    ) -> None:
        now = self._clock()
        ok = error is None and status_code is not None and 200 <= status_code < 300
        if error is None and not ok:
            error = f"http_{status_code}"
        async with session_scope(self._sessionmaker) as session:
            delivery = await session.get(WebhookDelivery, delivery_id)
            if delivery is None:
                return
            attempts = delivery.attempts + 1
            entry = {
                "at": now.isoformat(),
                "status_code": status_code,
                "duration_ms": duration_ms,
                "error": error,
            }
            values: dict[str, object] = {
                "attempts": attempts,
                "attempt_log": [*delivery.attempt_log, entry][-KEPT_ATTEMPTS:],
                "last_status_code": status_code,
                "last_error": error,
                "lease_until": None,
                "updated_at": now,
            }
            if ok:
                values.update(status=DeliveryStatus.SUCCEEDED, delivered_at=now)
            elif attempts >= self._config.max_attempts:
                values.update(status=DeliveryStatus.FAILED)
            else:
                values.update(
                    next_attempt_at=now + timedelta(seconds=self.backoff_seconds(attempts))
                )
            await session.execute(
                update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**values)
            )
            if ok:
                await session.execute(
                    update(Webhook)
                    .where(Webhook.id == webhook_id, Webhook.consecutive_failures != 0)
                    .values(consecutive_failures=0)
                )
                return
            await session.execute(
                update(Webhook)
                .where(Webhook.id == webhook_id)
                .values(consecutive_failures=Webhook.consecutive_failures + 1)
            )
            limit = self._config.disable_after_failures
            disabled = await session.execute(
                update(Webhook)
                .where(
                    and_(
                        Webhook.id == webhook_id,
                        Webhook.enabled,
                        Webhook.consecutive_failures >= limit,
                    )
                )
                .values(enabled=False, disabled_reason=f"{limit} consecutive failed deliveries")
            )
            if disabled.rowcount == 1:  # type: ignore[attr-defined]
                webhook = await session.get(Webhook, webhook_id, populate_existing=True)
                assert webhook is not None
                log.warning("webhook %s disabled after %d consecutive failures", webhook_id, limit)
                emit(
                    session,
                    "webhook.disabled",
                    namespace=webhook.namespace,
                    data={
                        "webhook_id": str(webhook.id),
                        "url": redact_uri(webhook.url),
                        "consecutive_failures": webhook.consecutive_failures,
                        "last_error": error,
                    },
                )
