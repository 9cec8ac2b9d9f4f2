"""Namespace usage and limits: GET /api/v1/namespaces (admin), GET …/{ns}/usage, PUT
…/{ns}/limits (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import AdminToken, ReadToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.limits import service
from tensor_registry_server.limits.schemas import LimitsIn, NamespaceListOut, NamespaceUsageOut

router = APIRouter(prefix="/api/v1/namespaces", tags=["limits"])

Namespace = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


async def _report(session: SessionDep, settings: SettingsDep, ns: str) -> NamespaceUsageOut:
    limits = await service.limits_for(session, settings, ns)
    usage = await service.usage_of(session, ns)
    return NamespaceUsageOut.model_validate(service.report(ns, limits, usage))


@router.get("", response_model=NamespaceListOut)
async def list_namespaces(
    session: SessionDep, settings: SettingsDep, principal: AdminToken
) -> NamespaceListOut:
    """Every namespace with its limits and usage: who is near a limit."""
    found = await service.all_usage(session, settings)
    return NamespaceListOut(
        items=[
            NamespaceUsageOut.model_validate(service.report(ns, limits, usage))
            for ns, (limits, usage) in found.items()
        ]
    )


@router.get("/{ns}/usage", response_model=NamespaceUsageOut)
async def namespace_usage(
    ns: Namespace, session: SessionDep, settings: SettingsDep, principal: ReadToken
) -> NamespaceUsageOut:
    principal.require_namespace(ns)
    return await _report(session, settings, ns)


@router.put("/{ns}/limits", response_model=NamespaceUsageOut)
async def set_namespace_limits(
    ns: Namespace,
    data: LimitsIn,
    session: SessionDep,
    settings: SettingsDep,
    principal: AdminToken,
) -> NamespaceUsageOut:
    values = data.model_dump(exclude_unset=True)
    await service.set_limits(session, ns, values)
    record(
        session,
        action="namespace.limits",
        actor=principal,
        target_type="namespace",
        target_id=ns,
        **values,
    )
    return await _report(session, settings, ns)
