from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, status

from tensor_registry_server.auth import ReadToken, WriteToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.etags import check_if_match, etag_for
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.schemas import ListOut, VariantDefaults
from tensor_registry_server.deps import StoragesDep
from tensor_registry_server.models import service
from tensor_registry_server.models.schemas import ModelCreate, ModelOut, ModelSummary, ModelUpdate
from tensor_registry_server.models.summary import summarize
from tensor_registry_server.rows.models import Model

router = APIRouter(prefix="/api/v1/models", tags=["models"])


def to_out(model: Model, summary: ModelSummary | None = None) -> ModelOut:
    return ModelOut(
        id=model.id,
        name=model.name,
        namespace=model.namespace,
        description=model.description,
        tags=[t.tag for t in model.tags],
        created_at=model.created_at,
        updated_at=model.updated_at,
        etag=etag_for(model.revision),
        default_variant=VariantDefaults.from_row(model.default_variant),
        summary=summary,
    )


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ModelOut)
async def create_model(
    body: ModelCreate, session: SessionDep, principal: WriteToken, response: Response
) -> ModelOut:
    model = await service.create_model(session, principal, body)
    response.headers["Location"] = f"/api/v1/models/{model.id}"
    response.headers["ETag"] = etag_for(model.revision)
    return to_out(model)


@router.get("", response_model=ListOut[ModelOut])
async def list_models(
    session: SessionDep,
    principal: ReadToken,
    q: Annotated[
        str | None, Query(max_length=200, description="Substring of name/description")
    ] = None,
    tag: Annotated[str | None, Query(max_length=64)] = None,
    name: Annotated[str | None, Query(max_length=128, description="Exact name")] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> ListOut[ModelOut]:
    page = await service.list_models(
        session, principal, q=q, tag=tag, name=name, cursor=cursor, limit=limit
    )
    summaries = await summarize(session, [m.id for m in page.items])
    return ListOut[ModelOut](
        items=[to_out(m, summaries[m.id]) for m in page.items], next_cursor=page.next_cursor
    )


@router.get("/{model_id}", response_model=ModelOut)
async def get_model(
    model_id: uuid.UUID, session: SessionDep, principal: ReadToken, response: Response
) -> ModelOut:
    model = await service.get_model(session, principal, model_id)
    response.headers["ETag"] = etag_for(model.revision)
    return to_out(model, (await summarize(session, [model.id]))[model.id])


@router.patch("/{model_id}", response_model=ModelOut)
async def update_model(
    model_id: uuid.UUID,
    body: ModelUpdate,
    session: SessionDep,
    principal: WriteToken,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> ModelOut:
    model = await service.get_model(session, principal, model_id)
    check_if_match(if_match, model.revision)
    model = await service.update_model(session, principal, model, body)
    response.headers["ETag"] = etag_for(model.revision)
    return to_out(model)


@router.delete("/{model_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_model(
    model_id: uuid.UUID,
    session: SessionDep,
    principal: WriteToken,
    storages: StoragesDep,
    if_match: Annotated[str | None, Header()] = None,
) -> Response:
    model = await service.get_model(session, principal, model_id)
    check_if_match(if_match, model.revision)
    await service.delete_model(session, principal, model, storages=storages)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
