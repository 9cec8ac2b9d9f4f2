from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.key_delivery import service

router = APIRouter(prefix="/api/v1/keys", tags=["keys"])


@router.get(
    "/{artifact_id}",
    response_class=Response,
    summary="The raw 32-byte key of an encrypted artifact (signed URL, no bearer token)",
    responses={
        200: {
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
            "description": "Exactly 32 bytes, as tensorizer's DecryptionParams.from_key wants.",
        },
        403: {"description": "`signature_invalid` or `signature_expired`."},
        404: {"description": "`artifact_not_found` or `key_not_found`."},
    },
)
async def get_key(
    artifact_id: str,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    exp: Annotated[str | None, Query(max_length=20)] = None,
    sig: Annotated[str | None, Query(max_length=128)] = None,
) -> Response:
    key = await service.fetch_key(
        session,
        artifact_id,
        exp=exp,
        sig=sig,
        settings=settings,
        client=request.client.host if request.client else None,
        user_agent=request.headers.get("user-agent"),
    )
    return Response(
        content=key,
        media_type="application/octet-stream",
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )
