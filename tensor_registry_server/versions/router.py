from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Path, Request, Response, status
from fastapi.responses import StreamingResponse

from tensor_registry_server.auth import ReadToken, WriteToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.errors import LengthRequired
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.core.schemas import FileOut, ListOut
from tensor_registry_server.core.tenant_bytes import TENANT_BYTES_HEADERS
from tensor_registry_server.deps import SenderDep, StoragesDep
from tensor_registry_server.models.service import get_model
from tensor_registry_server.rows.versions import Version
from tensor_registry_server.versions import convert, service
from tensor_registry_server.versions.schemas import RemoteCode, VersionCreate, VersionOut

router = APIRouter(prefix="/api/v1/models/{model_id}/versions", tags=["versions"])

VersionNumber = Annotated[int, Path(ge=1, le=2**31 - 1)]


def to_out(version: Version) -> VersionOut:
    return VersionOut(
        id=version.id,
        model_id=version.model_id,
        version=version.number,
        status=version.status,
        storage=version.storage,
        source_uri=redact_uri(version.source_uri) if version.source_uri else None,
        job_id=version.job_id,
        files=[FileOut(path=f.path, size=f.size, sha256=f.sha256) for f in version.files],
        size=service.version_size(version),
        created_at=version.created_at,
        finalized_at=version.finalized_at,
        architecture=version.architecture,
        parameter_count=version.parameter_count,
        dtype_breakdown=version.dtype_breakdown,
        remote_code=RemoteCode.model_validate(version.remote_code) if version.remote_code else None,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=VersionOut,
    responses={202: {"description": "Import started; Location points at the job."}},
)
async def create_version(
    model_id: uuid.UUID,
    session: SessionDep,
    principal: WriteToken,
    storages: StoragesDep,
    sender: SenderDep,
    response: Response,
    body: VersionCreate | None = None,
) -> VersionOut:
    model = await get_model(session, principal, model_id)
    version, job = await service.create_version(
        session, principal, model, body or VersionCreate(), storages=storages, sender=sender
    )
    if job is not None:
        response.status_code = status.HTTP_202_ACCEPTED
        response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    else:
        response.headers["Location"] = f"/api/v1/models/{model_id}/versions/{version.number}"
    return to_out(version)


@router.post(
    "/{number}/convert",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=VersionOut,
    responses={202: {"description": "Conversion started; Location points at the job."}},
)
async def convert_version(
    model_id: uuid.UUID,
    number: VersionNumber,
    session: SessionDep,
    principal: WriteToken,
    storages: StoragesDep,
    sender: SenderDep,
    response: Response,
) -> VersionOut:
    """Convert the version's pickle-based weights (``.bin``, ``.pt`` …) to safetensors on a
    worker, loading them with ``weights_only`` in an isolated process; the result is a new
    version (returned, ``importing`` until the job ends)."""
    model = await get_model(session, principal, model_id)
    version, job = await convert.request_conversion(
        session, principal, model, number, storages=storages, sender=sender
    )
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    return to_out(version)


@router.get("", response_model=ListOut[VersionOut])
async def list_versions(
    model_id: uuid.UUID,
    session: SessionDep,
    principal: ReadToken,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> ListOut[VersionOut]:
    model = await get_model(session, principal, model_id)
    page = await service.list_versions(session, model, cursor=cursor, limit=limit)
    return ListOut[VersionOut](items=[to_out(v) for v in page.items], next_cursor=page.next_cursor)


@router.get("/{number}", response_model=VersionOut)
async def get_version(
    model_id: uuid.UUID, number: VersionNumber, session: SessionDep, principal: ReadToken
) -> VersionOut:
    model = await get_model(session, principal, model_id)
    return to_out(await service.get_version(session, model, number))


@router.delete("/{number}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_version(
    model_id: uuid.UUID,
    number: VersionNumber,
    session: SessionDep,
    principal: WriteToken,
    storages: StoragesDep,
) -> Response:
    model = await get_model(session, principal, model_id)
    await service.delete_version(session, principal, model, number, storages=storages)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.put(
    "/{number}/files/{path:path}",
    status_code=status.HTTP_201_CREATED,
    response_model=FileOut,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_file(
    model_id: uuid.UUID,
    number: VersionNumber,
    path: str,
    request: Request,
    session: SessionDep,
    principal: WriteToken,
    storages: StoragesDep,
    response: Response,
    content_length: Annotated[int | None, Header(ge=0, le=2**63 - 1)] = None,
    x_content_sha256: Annotated[str | None, Header()] = None,
) -> FileOut:
    if content_length is None:
        raise LengthRequired("Uploads need a Content-Length header.", code="length_required")
    model = await get_model(session, principal, model_id)
    target = await service.start_upload(
        session,
        model,
        number,
        path,
        content_length=content_length,
        expected_sha256=x_content_sha256,
        storages=storages,
    )
    # End the transaction before the body streams: its connection goes back to the pool, so
    # slow uploads cannot starve every other request of database connections. The row is
    # written in a second, short transaction once the bytes are stored.
    await session.commit()
    stored = await service.receive_upload(target, request.stream(), storages=storages)
    row = await service.record_upload(session, principal, model, target, stored, storages=storages)
    response.headers["Location"] = f"/api/v1/models/{model_id}/versions/{number}/files/{path}"
    return FileOut(path=row.path, size=row.size, sha256=row.sha256)


@router.get(
    "/{number}/files/{path:path}",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
            "description": "The file's bytes (the web UI reads README.md and config.json here). "
            "Always `application/octet-stream` as an attachment with `nosniff`, so a browser "
            "never renders uploaded content; `ETag` is the sha256. Serving nodes use the "
            "signed URLs from /resolve instead.",
        }
    },
)
async def download_file(
    model_id: uuid.UUID,
    number: VersionNumber,
    path: str,
    session: SessionDep,
    principal: ReadToken,
    storages: StoragesDep,
) -> StreamingResponse:
    model = await get_model(session, principal, model_id)
    version, row = await service.get_file(session, model, number, path)
    return StreamingResponse(
        storages.get(version.storage).read(row.storage_key),
        media_type="application/octet-stream",
        headers={
            **TENANT_BYTES_HEADERS,
            "Content-Length": str(row.size),
            "ETag": f'"{row.sha256}"',
            "Cache-Control": "private, no-store",
        },
    )


@router.delete("/{number}/files/{path:path}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_file(
    model_id: uuid.UUID,
    number: VersionNumber,
    path: str,
    session: SessionDep,
    principal: WriteToken,
    storages: StoragesDep,
) -> Response:
    model = await get_model(session, principal, model_id)
    await service.delete_file(session, principal, model, number, path, storages=storages)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{number}/finalize", response_model=VersionOut)
async def finalize_version(
    model_id: uuid.UUID,
    number: VersionNumber,
    session: SessionDep,
    principal: WriteToken,
    storages: StoragesDep,
) -> VersionOut:
    model = await get_model(session, principal, model_id)
    await service.finalize_version(session, principal, model, number, storages=storages)
    return to_out(await service.get_version(session, model, number))
