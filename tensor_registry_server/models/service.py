"""Models: named entities `namespace/name` owning versions, artifacts and aliases."""

from __future__ import annotations

import uuid

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import Conflict, NotFound
from tensor_registry_server.core.pagination import Page, paginate
from tensor_registry_server.jobs import transition_events
from tensor_registry_server.models.schemas import ModelCreate, ModelUpdate
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.models import Model, ModelTag
from tensor_registry_server.rows.versions import Version
from tensor_registry_server.storage.deferred_delete import delete_after_commit
from tensor_registry_server.storage.object_keys import version_prefix
from tensor_registry_server.storage.registry import StorageRegistry


async def get_model(
    session: AsyncSession, principal: Principal, model_id: uuid.UUID, *, for_update: bool = False
) -> Model:
    stmt = select(Model).where(Model.id == model_id).options(selectinload(Model.tags))
    model = (await session.execute(stmt)).scalar_one_or_none()
    if model is None or not principal.can_access_namespace(model.namespace):
        # The same answer for another namespace's model as for a missing one: an id must not
        # tell a namespace-limited token that something exists where it may not look.
        raise NotFound(f"No model with id {model_id}.", code="model_not_found")
    return model


async def create_model(session: AsyncSession, principal: Principal, data: ModelCreate) -> Model:
    namespace = data.name.split("/", 1)[0]
    principal.require_namespace(namespace)
    taken = await session.scalar(select(func.count()).where(Model.name == data.name))
    if taken:
        raise Conflict(f"The name '{data.name}' is taken.", code="name_taken")
    model = Model(
        name=data.name,
        namespace=namespace,
        description=data.description,
        tags=[ModelTag(tag=t) for t in data.tags],
    )
    session.add(model)
    await session.flush()
    record(
        session,
        action="model.create",
        actor=principal,
        target_type="model",
        target_id=model.id,
        model=model.name,
    )
    return model


async def list_models(
    session: AsyncSession,
    principal: Principal,
    *,
    q: str | None,
    tag: str | None,
    name: str | None,
    cursor: str | None,
    limit: int,
) -> Page[Model]:
    stmt = select(Model).options(selectinload(Model.tags))
    if principal.namespaces is not None:
        stmt = stmt.where(Model.namespace.in_(sorted(principal.namespaces)))
    if name:
        stmt = stmt.where(Model.name == name)
    if q:
        pattern = (
            "%" + q.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        )
        stmt = stmt.where(
            or_(
                func.lower(Model.name).like(pattern, escape="\\"),
                func.lower(Model.description).like(pattern, escape="\\"),
            )
        )
    if tag:
        stmt = stmt.where(Model.id.in_(select(ModelTag.model_id).where(ModelTag.tag == tag)))
    return await paginate(session, stmt, keys=[Model.name], cursor=cursor, limit=limit)


async def update_model(
    session: AsyncSession, principal: Principal, model: Model, data: ModelUpdate
) -> Model:
    changed: dict[str, object] = {}
    if data.description is not None and data.description != model.description:
        model.description = data.description
        changed["description"] = True
    if data.tags is not None and data.tags != [t.tag for t in model.tags]:
        model.tags = [ModelTag(tag=t) for t in data.tags]
        changed["tags"] = data.tags
    if "default_variant" in data.model_fields_set:
        wanted = data.default_variant.stored() if data.default_variant is not None else None
        if wanted != model.default_variant:
            model.default_variant = wanted
            changed["default_variant"] = wanted
    if changed:
        # Touch the row itself so that the revision (ETag) moves for tag-only changes too.
        model.updated_at = utcnow()
        await session.flush()
        record(
            session,
            action="model.update",
            actor=principal,
            target_type="model",
            target_id=model.id,
            model=model.name,
            **changed,
        )
    return model


async def delete_model(
    session: AsyncSession, principal: Principal, model: Model, *, storages: StorageRegistry
) -> None:
    """Delete the model and everything under it; its bytes go after the commit."""

    artifacts = await transition_events.announce_artifacts_deleted(
        session, model.name, Artifact.model_id == model.id
    )
    prefixes = [(artifact.storage, artifact.storage_prefix) for artifact in artifacts]
    prefixes += [
        (storage, version_prefix(version_id))
        for storage, version_id in (
            await session.execute(
                select(Version.storage, Version.id).where(Version.model_id == model.id)
            )
        ).all()
    ]
    record(
        session,
        action="model.delete",
        actor=principal,
        target_type="model",
        target_id=model.id,
        model=model.name,
    )
    await session.delete(model)
    await session.flush()
    for storage_name, prefix in prefixes:
        delete_after_commit(session, storages, storage_name, prefix)
