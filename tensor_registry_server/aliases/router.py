from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Response, status
from pydantic import BaseModel

from tensor_registry_server.aliases import service
from tensor_registry_server.aliases.schemas import AliasEventOut, AliasOut, AliasSet
from tensor_registry_server.auth import ReadToken, WriteToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.etags import etag_for, none_match
from tensor_registry_server.core.schemas import VariantDefaults
from tensor_registry_server.models.service import get_model
from tensor_registry_server.rows.aliases import Alias, AliasEvent

router = APIRouter(prefix="/api/v1/models/{model_id}/aliases", tags=["aliases"])


class AliasList(BaseModel):
    items: list[AliasOut]
    history: list[AliasEventOut]
    next_cursor: str | None = None


def _event(e: AliasEvent) -> AliasEventOut:
    return AliasEventOut(
        alias=e.alias,
        from_version=e.from_version,
        to_version=e.to_version,
        actor=e.actor,
        created_at=e.created_at,
    )


def to_out(alias: Alias, events: list[AliasEvent]) -> AliasOut:
    return AliasOut(
        model_id=alias.model_id,
        alias=alias.name,
        version=alias.version_number,
        etag=etag_for(alias.revision),
        default_variant=VariantDefaults.from_row(alias.default_variant),
        created_at=alias.created_at,
        updated_at=alias.updated_at,
        history=[_event(e) for e in events if e.alias == alias.name],
    )


@router.get("", response_model=AliasList)
async def list_aliases(model_id: uuid.UUID, session: SessionDep, principal: ReadToken) -> AliasList:
    model = await get_model(session, principal, model_id)
    aliases = await service.list_aliases(session, model)
    events = await service.history(session, model)
    return AliasList(
        items=[to_out(a, events) for a in aliases], history=[_event(e) for e in events]
    )


@router.get(
    "/{alias}",
    response_model=AliasOut,
    responses={304: {"description": "If-None-Match names the alias's current ETag."}},
)
async def get_alias(
    model_id: uuid.UUID,
    alias: str,
    session: SessionDep,
    principal: ReadToken,
    response: Response,
    if_none_match: Annotated[str | None, Header()] = None,
) -> AliasOut | Response:
    model = await get_model(session, principal, model_id)
    row = await service.get_alias(session, model, alias)
    if none_match(if_none_match, row.revision):
        # A node polling "did prod move?" gets its answer without the body.
        return Response(status_code=304, headers={"ETag": etag_for(row.revision)})
    response.headers["ETag"] = etag_for(row.revision)
    return to_out(row, await service.history(session, model, alias))


@router.put(
    "/{alias}",
    response_model=AliasOut,
    responses={201: {"description": "Alias created", "model": AliasOut}},
)
async def set_alias(
    model_id: uuid.UUID,
    alias: str,
    body: AliasSet,
    session: SessionDep,
    principal: WriteToken,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> AliasOut:
    model = await get_model(session, principal, model_id)
    row, created = await service.set_alias(
        session,
        principal,
        model,
        alias,
        body.version,
        if_match=if_match,
        default_variant=(
            (body.default_variant.stored() if body.default_variant is not None else None)
            if "default_variant" in body.model_fields_set
            else service.UNCHANGED
        ),
    )
    if created:
        response.status_code = status.HTTP_201_CREATED
        response.headers["Location"] = f"/api/v1/models/{model_id}/aliases/{alias}"
    response.headers["ETag"] = etag_for(row.revision)
    return to_out(row, await service.history(session, model, alias))


@router.delete("/{alias}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_alias(
    model_id: uuid.UUID,
    alias: str,
    session: SessionDep,
    principal: WriteToken,
    if_match: Annotated[str | None, Header()] = None,
) -> Response:
    model = await get_model(session, principal, model_id)
    await service.delete_alias(session, principal, model, alias, if_match=if_match)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
