"""``GET/HEAD /api/v1/blobs/{storage}/{key}``: signed downloads (the signature is the auth)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response

from tensor_registry_server.blobs import service
from tensor_registry_server.deps import SettingsDep, StoragesDep

router = APIRouter(prefix="/api/v1/blobs", tags=["blobs"])


# A shared HTTP cache in front of the blob URLs asks here before it answers from its copy
# (deploy/nginx-cache.conf: nginx's auth_request; docs/fan-out.md). One path segment: never a
# stored file's path, which is /{storage}/{key}.
@router.get(
    "/auth",
    status_code=204,
    summary="Check a blob URL's signature for a shared cache (no bytes)",
    description=(
        "For a cache tier in front of the registry (nginx `auth_request`, a CDN's edge "
        "authorization): the original request target in `X-Original-URI` is checked like "
        "`GET /api/v1/blobs/…` checks it: 204 when it is a blob URL whose signature is valid "
        "now, else 403 `signature_invalid` / `signature_expired`. Reads no storage and sends no "
        "body; the cache keys the bytes by the URL's path, never by its signature."
    ),
    responses={403: {"description": "signature_invalid or signature_expired"}},
)
async def blob_auth(
    settings: SettingsDep,
    x_original_uri: Annotated[str | None, Header()] = None,
) -> Response:
    service.check_cached_request(settings, x_original_uri)
    return Response(status_code=204)


_DESCRIPTION = (
    "Signed download of a stored file, as handed out by `/api/v1/resolve`. No bearer token: "
    "`exp` and `sig` in the query are the auth and cover one artifact's or version's files "
    "(so a `%03d` rank template filled in by vLLM still verifies). HTTP/1.1, `Range` "
    "(single, suffix, open or multiple) → 206 with exactly those bytes, `HEAD` with "
    "`Content-Length`, `Accept-Ranges: bytes`, `ETag`, `If-Range`; never a redirect. "
    "403 `signature_invalid` / `signature_expired`, then 404 `blob_not_found`, 416 "
    "`range_not_satisfiable` with `Content-Range: bytes */size`."
)


async def get_blob(
    storage: str,
    key: str,
    request: Request,
    settings: SettingsDep,
    storages: StoragesDep,
    exp: Annotated[str | None, Query(description="Expiry, Unix seconds.")] = None,
    sig: Annotated[str | None, Query(description="HMAC signature.")] = None,
    range: Annotated[str | None, Header()] = None,
    if_range: Annotated[str | None, Header()] = None,
) -> service.BlobResponse:
    return await service.serve_blob(
        settings,
        storages,
        storage,
        key,
        method=request.method,
        exp=exp,
        sig=sig,
        range_header=range,
        if_range=if_range,
    )


_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "The whole file."},
    206: {"description": "The requested range(s)."},
    403: {"description": "signature_invalid or signature_expired"},
    404: {"description": "blob_not_found"},
    416: {"description": "range_not_satisfiable"},
}

# GET and HEAD as two operations (one handler), so the OpenAPI operation ids stay unique.
for _method in ("GET", "HEAD"):
    router.add_api_route(
        "/{storage}/{key:path}",
        get_blob,
        methods=[_method],
        operation_id=f"{_method.lower()}_blob",
        summary=f"{'Download' if _method == 'GET' else 'Headers of'} a stored file (signed URL)",
        description=_DESCRIPTION,
        status_code=200,
        response_class=service.BlobResponse,
        responses=_RESPONSES,
    )
