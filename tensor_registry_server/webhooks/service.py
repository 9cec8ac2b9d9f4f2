"""Webhook subscriptions: create (secret shown once, stored wrapped), read, change, delete, the
delivery log and redelivery by hand. Sending is tensor_registry_server/webhooks/delivery.py."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.events import EVENT_TYPES
from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.addresses import AllowList
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import Conflict, Invalid, NotFound
from tensor_registry_server.core.events_outbox import newest_id
from tensor_registry_server.core.fetch import FetchError, check_literal
from tensor_registry_server.core.key_wrapping import unwrap_key, wrap_key
from tensor_registry_server.core.pagination import Page, paginate
from tensor_registry_server.rows.webhooks import DeliveryStatus, Webhook, WebhookDelivery
from tensor_registry_server.settings import Settings
from tensor_registry_server.webhooks import signing
from tensor_registry_server.webhooks.schemas import WebhookCreate, WebhookUpdate


def _check_events(events: list[str]) -> list[str]:
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        raise Invalid(
            f"Unknown event types: {', '.join(unknown)}.",
            code="unknown_event_type",
            known=list(EVENT_TYPES),
        )
    return sorted(set(events))


def _check_url(url: str, settings: Settings) -> None:
    """Refuse at once what the fetcher would refuse anyway (a literal internal address); names
    are resolved and checked again at every delivery (DNS may change)."""
    try:
        check_literal(url, AllowList.parse(settings.fetch.allow))
    except FetchError:
        raise Invalid(
            "The webhook URL is refused: this registry does not send to internal addresses "
            "(an operator can allow one with TENSOR_REGISTRY_FETCH__ALLOW).",
            code="webhook_url_refused",
        ) from None


async def create_webhook(
    session: AsyncSession, principal: Principal, body: WebhookCreate, settings: Settings
) -> tuple[Webhook, str]:
    principal.require_scope("models:write")
    principal.require_namespace(body.namespace)
    _check_url(body.url, settings)
    events = _check_events(body.events)
    count = await session.scalar(
        select(func.count()).select_from(Webhook).where(Webhook.namespace == body.namespace)
    )
    if (count or 0) >= settings.webhooks.max_per_namespace:
        raise Conflict(
            f"Namespace '{body.namespace}' already has {count} webhooks.",
            code="too_many_webhooks",
        )
    shown, raw = signing.new_secret()
    webhook_id = uuid.uuid4()
    webhook = Webhook(
        id=webhook_id,
        namespace=body.namespace,
        url=body.url,
        description=body.description,
        event_types=events,
        secret_wrapped=wrap_key(settings.master_key_bytes(), raw, artifact_id=webhook_id),
        enabled=True,
        consecutive_failures=0,
        # Events from now on: a new subscription does not replay the namespace's past.
        cursor=await newest_id(session),
        created_by=principal.name,
    )
    session.add(webhook)
    await session.flush()
    record(
        session,
        action="webhook.create",
        actor=principal,
        target_type="webhook",
        target_id=webhook.id,
        namespace=body.namespace,
        events=events,
    )
    return webhook, shown


async def get_webhook(
    session: AsyncSession, principal: Principal, webhook_id: uuid.UUID
) -> Webhook:
    webhook = await session.get(Webhook, webhook_id)
    if webhook is None or not principal.can_access_namespace(webhook.namespace):
        raise NotFound(f"No webhook with id {webhook_id}.", code="webhook_not_found")
    return webhook


async def list_webhooks(
    session: AsyncSession, principal: Principal, *, cursor: str | None, limit: int
) -> Page[Webhook]:
    stmt = select(Webhook)
    if principal.namespaces is not None:
        stmt = stmt.where(Webhook.namespace.in_(sorted(principal.namespaces)))
    return await paginate(
        session, stmt, keys=[Webhook.created_at, Webhook.id], cursor=cursor, limit=limit
    )


async def update_webhook(
    session: AsyncSession,
    principal: Principal,
    webhook_id: uuid.UUID,
    body: WebhookUpdate,
    settings: Settings,
) -> Webhook:
    principal.require_scope("models:write")
    webhook = await get_webhook(session, principal, webhook_id)
    if body.url is not None:
        _check_url(body.url, settings)
        webhook.url = body.url
    if body.events is not None:
        webhook.event_types = _check_events(body.events)
    if body.description is not None:
        webhook.description = body.description
    if body.enabled is not None and body.enabled != webhook.enabled:
        webhook.enabled = body.enabled
        webhook.disabled_reason = None if body.enabled else "disabled by hand"
        webhook.consecutive_failures = 0
    await session.flush()
    record(
        session,
        action="webhook.update",
        actor=principal,
        target_type="webhook",
        target_id=webhook.id,
        namespace=webhook.namespace,
        enabled=webhook.enabled,
    )
    return webhook


async def delete_webhook(
    session: AsyncSession, principal: Principal, webhook_id: uuid.UUID
) -> None:
    principal.require_scope("models:write")
    webhook = await get_webhook(session, principal, webhook_id)
    record(
        session,
        action="webhook.delete",
        actor=principal,
        target_type="webhook",
        target_id=webhook.id,
        namespace=webhook.namespace,
    )
    await session.delete(webhook)
    await session.flush()


async def list_deliveries(
    session: AsyncSession,
    principal: Principal,
    webhook_id: uuid.UUID,
    *,
    status: str | None,
    cursor: str | None,
    limit: int,
) -> Page[WebhookDelivery]:
    await get_webhook(session, principal, webhook_id)
    stmt = select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
    if status is not None:
        stmt = stmt.where(WebhookDelivery.status == status)
    return await paginate(
        session,
        stmt,
        keys=[WebhookDelivery.event_id, WebhookDelivery.id],
        cursor=cursor,
        limit=limit,
        descending=True,
    )


async def redeliver(
    session: AsyncSession, principal: Principal, webhook_id: uuid.UUID, delivery_id: uuid.UUID
) -> WebhookDelivery:
    """Send the delivery again now, whatever became of it (the same ``webhook-id``)."""
    principal.require_scope("models:write")
    await get_webhook(session, principal, webhook_id)
    delivery = await session.get(WebhookDelivery, delivery_id)
    if delivery is None or delivery.webhook_id != webhook_id:
        raise NotFound(f"No delivery with id {delivery_id}.", code="delivery_not_found")
    now = utcnow()
    await session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id)
        .values(
            status=DeliveryStatus.PENDING, next_attempt_at=now, lease_until=None, updated_at=now
        )
    )
    await session.refresh(delivery)
    record(
        session,
        action="webhook.redeliver",
        actor=principal,
        target_type="webhook_delivery",
        target_id=delivery.id,
        event_id=delivery.event_id,
    )
    return delivery


def secret_of(webhook: Webhook, settings: Settings) -> bytes:
    return unwrap_key(settings.master_key_bytes(), webhook.secret_wrapped, artifact_id=webhook.id)
