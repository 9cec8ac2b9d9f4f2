from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from tensor_registry_server.auth import ReadToken, WriteToken
from tensor_registry_server.core.db import SessionDep, after_commit
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.core.schemas import ListOut
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.rows.webhooks import Webhook, WebhookDelivery
from tensor_registry_server.webhooks import service
from tensor_registry_server.webhooks.schemas import (
    AttemptOut,
    DeliveryOut,
    WebhookCreate,
    WebhookCreated,
    WebhookOut,
    WebhookUpdate,
)

router = APIRouter(prefix="/api/v1/webhooks", tags=["webhooks"])


def to_out(webhook: Webhook) -> WebhookOut:
    # The URL as events and logs show it (no user:password, no query tokens): a read-only token
    # lists webhooks too, and a receiver's credentials are for the deliveries, not for readers.
    return WebhookOut(
        id=webhook.id,
        namespace=webhook.namespace,
        url=redact_uri(webhook.url),
        events=list(webhook.event_types),
        description=webhook.description,
        enabled=webhook.enabled,
        disabled_reason=webhook.disabled_reason,
        consecutive_failures=webhook.consecutive_failures,
        created_at=webhook.created_at,
        updated_at=webhook.updated_at,
    )


def delivery_out(d: WebhookDelivery) -> DeliveryOut:
    return DeliveryOut(
        id=d.id,
        webhook_id=d.webhook_id,
        event_id=d.event_id,
        event_type=d.event_type,
        status=d.status,
        attempts=d.attempts,
        next_attempt_at=d.next_attempt_at if d.status == "pending" else None,
        last_status_code=d.last_status_code,
        last_error=d.last_error,
        delivered_at=d.delivered_at,
        created_at=d.created_at,
        attempt_log=[AttemptOut.model_validate(a) for a in d.attempt_log],
    )


@router.post("", status_code=status.HTTP_201_CREATED, response_model=WebhookCreated)
async def create_webhook(
    body: WebhookCreate,
    response: Response,
    session: SessionDep,
    principal: WriteToken,
    settings: SettingsDep,
) -> WebhookCreated:
    webhook, secret = await service.create_webhook(session, principal, body, settings)
    response.headers["Location"] = f"/api/v1/webhooks/{webhook.id}"
    return WebhookCreated(**to_out(webhook).model_dump(), secret=secret)


@router.get("", response_model=ListOut[WebhookOut])
async def list_webhooks(
    session: SessionDep, principal: ReadToken, cursor: Cursor = None, limit: Limit = 50
) -> ListOut[WebhookOut]:
    page = await service.list_webhooks(session, principal, cursor=cursor, limit=limit)
    return ListOut[WebhookOut](items=[to_out(w) for w in page.items], next_cursor=page.next_cursor)


@router.get("/{webhook_id}", response_model=WebhookOut)
async def get_webhook(
    webhook_id: uuid.UUID, session: SessionDep, principal: ReadToken
) -> WebhookOut:
    return to_out(await service.get_webhook(session, principal, webhook_id))


@router.patch("/{webhook_id}", response_model=WebhookOut)
async def update_webhook(
    webhook_id: uuid.UUID,
    body: WebhookUpdate,
    session: SessionDep,
    principal: WriteToken,
    settings: SettingsDep,
) -> WebhookOut:
    return to_out(await service.update_webhook(session, principal, webhook_id, body, settings))


@router.delete("/{webhook_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_webhook(webhook_id: uuid.UUID, session: SessionDep, principal: WriteToken) -> None:
    await service.delete_webhook(session, principal, webhook_id)


@router.get("/{webhook_id}/deliveries", response_model=ListOut[DeliveryOut])
async def list_deliveries(
    webhook_id: uuid.UUID,
    session: SessionDep,
    principal: ReadToken,
    status: Annotated[str | None, Query(pattern="^(pending|succeeded|failed)$")] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> ListOut[DeliveryOut]:
    page = await service.list_deliveries(
        session, principal, webhook_id, status=status, cursor=cursor, limit=limit
    )
    return ListOut[DeliveryOut](
        items=[delivery_out(d) for d in page.items], next_cursor=page.next_cursor
    )


@router.post(
    "/{webhook_id}/deliveries/{delivery_id}/redeliver",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DeliveryOut,
)
async def redeliver(
    webhook_id: uuid.UUID,
    delivery_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: WriteToken,
) -> DeliveryOut:
    delivery = await service.redeliver(session, principal, webhook_id, delivery_id)
    deliverer = getattr(request.app.state, "webhook_deliverer", None)
    if deliverer is not None:
        # After the commit: the loop must see the row pending.
        async def kick() -> None:
            deliverer.kick()

        after_commit(session, kick)
    return delivery_out(delivery)
