from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from tensor_registry_server.auth import AdminToken, ReadToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.models.service import get_model
from tensor_registry_server.retention import service
from tensor_registry_server.retention.schemas import RetentionOut, RetentionSet

router = APIRouter(prefix="/api/v1", tags=["retention"])


@router.get("/namespaces/{namespace}/retention", response_model=RetentionOut)
async def get_namespace_retention(
    namespace: str, session: SessionDep, principal: ReadToken, settings: SettingsDep
) -> RetentionOut:
    service.check_namespace(principal, namespace)
    return await service.read(session, settings.retention, namespace, None)


@router.put("/namespaces/{namespace}/retention", response_model=RetentionOut)
async def set_namespace_retention(
    namespace: str,
    body: RetentionSet,
    session: SessionDep,
    principal: AdminToken,
    settings: SettingsDep,
) -> RetentionOut:
    service.check_namespace(principal, namespace)
    await service.put(session, principal, namespace, None, body)
    return await service.read(session, settings.retention, namespace, None)


@router.delete("/namespaces/{namespace}/retention", status_code=status.HTTP_204_NO_CONTENT)
async def delete_namespace_retention(
    namespace: str, session: SessionDep, principal: AdminToken
) -> Response:
    service.check_namespace(principal, namespace)
    await service.remove(session, principal, namespace, None)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/models/{model_id}/retention", response_model=RetentionOut)
async def get_model_retention(
    model_id: uuid.UUID, session: SessionDep, principal: ReadToken, settings: SettingsDep
) -> RetentionOut:
    model = await get_model(session, principal, model_id)
    return await service.read(session, settings.retention, model.namespace, model)


@router.put("/models/{model_id}/retention", response_model=RetentionOut)
async def set_model_retention(
    model_id: uuid.UUID,
    body: RetentionSet,
    session: SessionDep,
    principal: AdminToken,
    settings: SettingsDep,
) -> RetentionOut:
    model = await get_model(session, principal, model_id)
    await service.put(session, principal, model.namespace, model, body)
    return await service.read(session, settings.retention, model.namespace, model)


@router.delete("/models/{model_id}/retention", status_code=status.HTTP_204_NO_CONTENT)
async def delete_model_retention(
    model_id: uuid.UUID, session: SessionDep, principal: AdminToken
) -> Response:
    model = await get_model(session, principal, model_id)
    await service.remove(session, principal, model.namespace, model)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
