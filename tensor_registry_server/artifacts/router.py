from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, status
from fastapi.responses import JSONResponse

from tensor_registry_server.artifacts import register, service, variants
from tensor_registry_server.artifacts.schemas import (
    ArtifactOut,
    ArtifactRegister,
    EncryptionOut,
    TensorizeRequest,
)
from tensor_registry_server.artifacts.tensorize import request_tensorize
from tensor_registry_server.auth import ReadToken, TensorizeToken, WriteToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.core.schemas import Dtype, FileOut, Format, ListOut
from tensor_registry_server.deps import SenderDep, StoragesDep
from tensor_registry_server.jobs.answers import to_out as job_out
from tensor_registry_server.jobs.answers import variant_of
from tensor_registry_server.jobs.schemas import JobOut
from tensor_registry_server.models.service import get_model
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import JobStatus

router = APIRouter(tags=["artifacts"])

IdempotencyKey = Annotated[
    str | None,
    Header(
        max_length=255,
        description="Same key and token: the same job comes back; a different body is 422.",
    ),
]


def to_out(artifact: Artifact) -> ArtifactOut:
    return ArtifactOut(
        id=artifact.id,
        model_id=artifact.model_id,
        version=artifact.version_number,
        dtype=artifact.dtype,
        format=artifact.format,
        tensor_parallel_size=artifact.tensor_parallel_size,
        encryption=EncryptionOut(
            enabled=artifact.encrypted,
            key_id=artifact.key_id,
            algorithm=artifact.encryption_algorithm,
        ),
        storage=artifact.storage,
        status=artifact.status,
        files=[FileOut(path=f.path, size=f.size, sha256=f.sha256) for f in artifact.files],
        tensorizer_version=artifact.tensorizer_version,
        torch_version=artifact.torch_version,
        transformers_version=artifact.transformers_version,
        parameter_count=artifact.parameter_count,
        size=service.artifact_size(artifact),
        stats=dict(artifact.stats or {}),
        origin=artifact.origin,
        source_uri=redact_uri(artifact.source_uri) if artifact.source_uri else None,
        error=artifact.error,
        job_id=artifact.job_id,
        created_at=artifact.created_at,
        ready_at=artifact.ready_at,
    )


def _outcome_response(outcome: variants.Outcome) -> JSONResponse:
    if outcome.job is None:
        return JSONResponse(
            to_out(outcome.artifact).model_dump(mode="json"),
            status_code=status.HTTP_200_OK,
            headers={"Location": f"/api/v1/artifacts/{outcome.artifact.id}"},
        )
    code = 200 if outcome.job.status in JobStatus.FINAL else status.HTTP_202_ACCEPTED
    return JSONResponse(
        job_out(outcome.job, variant_of(outcome.job, outcome.artifact)).model_dump(mode="json"),
        status_code=code,
        headers={"Location": f"/api/v1/jobs/{outcome.job.id}"},
    )


@router.post(
    "/api/v1/models/{model_id}/tensorize",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses={
        200: {"model": ArtifactOut, "description": "That variant is already ready."},
        202: {"model": JobOut, "description": "Job queued (or already running); see Location."},
        409: {"description": "no_capable_worker, no_ready_version, version_not_ready"},
    },
)
async def tensorize(
    model_id: uuid.UUID,
    body: TensorizeRequest,
    session: SessionDep,
    principal: TensorizeToken,
    storages: StoragesDep,
    sender: SenderDep,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    model = await get_model(session, principal, model_id)
    outcome = await request_tensorize(
        session,
        principal,
        model,
        body,
        idempotency_key=idempotency_key,
        storages=storages,
        sender=sender,
    )
    return _outcome_response(outcome)


@router.post(
    "/api/v1/models/{model_id}/artifacts",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses={202: {"model": JobOut, "description": "Verify job queued; see Location."}},
)
async def register_artifact(
    model_id: uuid.UUID,
    body: ArtifactRegister,
    session: SessionDep,
    principal: WriteToken,
    storages: StoragesDep,
    sender: SenderDep,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    model = await get_model(session, principal, model_id)
    outcome = await register.register_artifact(
        session,
        principal,
        model,
        body,
        idempotency_key=idempotency_key,
        storages=storages,
        sender=sender,
    )
    return _outcome_response(outcome)


@router.get("/api/v1/models/{model_id}/artifacts", response_model=ListOut[ArtifactOut])
async def list_artifacts(
    model_id: uuid.UUID,
    session: SessionDep,
    principal: ReadToken,
    dtype: Dtype | None = None,
    format: Format | None = None,
    status_: Annotated[
        str | None, Query(alias="status", pattern="^(pending|running|ready|failed)$")
    ] = None,
    version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> ListOut[ArtifactOut]:
    model = await get_model(session, principal, model_id)
    page = await service.list_artifacts(
        session,
        model,
        dtype=dtype,
        format=format,
        status=status_,
        version=version,
        cursor=cursor,
        limit=limit,
    )
    return ListOut[ArtifactOut](items=[to_out(a) for a in page.items], next_cursor=page.next_cursor)


@router.get("/api/v1/artifacts/{artifact_id}", response_model=ArtifactOut)
async def get_artifact(
    artifact_id: uuid.UUID, session: SessionDep, principal: ReadToken
) -> ArtifactOut:
    artifact, _ = await service.get_artifact(session, principal, artifact_id)
    return to_out(artifact)


@router.delete("/api/v1/artifacts/{artifact_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_artifact(
    artifact_id: uuid.UUID, session: SessionDep, principal: WriteToken, storages: StoragesDep
) -> Response:
    await service.delete_artifact(session, principal, artifact_id, storages=storages)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
