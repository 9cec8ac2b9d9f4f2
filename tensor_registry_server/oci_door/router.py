"""``/v2/``: the OCI distribution spec's read side (pull), over the registry's own rows.

Routes: the version check (``GET /v2/``), the token flow (``GET /v2/token``), manifests by tag
or digest, blobs by digest (``Range`` and ``If-Range`` as the blob path serves them), and
``tags/list`` with ``n``/``last``. Every other method on ``/v2/…`` answers 405 ``UNSUPPORTED``:
this door is read-only. Errors use the spec's body (tensor_registry_server.oci_door.errors), not
problem+json.

Blob bytes take the registry's one serving path (tensor_registry_server.blobs.service): a local
file goes out with
``sendfile`` (zero-copy), any other backend streams; nothing is copied or re-hashed. What each
read grants is written to the audit log like a resolve (write-behind,
tensor_registry_server.resolve.audit_buffer);
each token-flow bearer issued is written in the request's own transaction.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request, Response

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.blobs.service import (
    RangeNotSatisfiable,
    open_stored,
    parse_range,
    respond,
)
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.errors import NotFound, ServiceUnavailable
from tensor_registry_server.deps import SettingsDep, StoragesDep
from tensor_registry_server.oci_door import modelpack, service
from tensor_registry_server.oci_door.errors import (
    API_VERSION_HEADER,
    OciError,
    OciRoute,
    blob_unknown,
    name_unknown,
    unavailable,
    unsupported,
)
from tensor_registry_server.oci_door.modelpack import Document, Subject
from tensor_registry_server.resolve.render import direct_urls

router = APIRouter(prefix="/v2", tags=["oci"], route_class=OciRoute)

Authorization = Annotated[str | None, Header(include_in_schema=False)]
BLOB_MEDIA_TYPE = "application/octet-stream"


def _audit(request: Request, **row: Any) -> None:
    buffer = getattr(request.app.state, "resolve_audit", None)
    if buffer is not None:
        buffer.add(**row)


async def version_check(
    session: SessionDep, settings: SettingsDep, authorization: Authorization = None
) -> Response:
    """``{}`` for good credentials: clients probe this first and start the token flow on 401."""
    await service.authenticate(session, settings, authorization)
    return Response(b"{}", media_type="application/json", headers=API_VERSION_HEADER)


async def token(
    session: SessionDep,
    settings: SettingsDep,
    authorization: Authorization = None,
    scope: Annotated[
        list[str] | None, Query(description="`repository:NAMESPACE/NAME:pull`, repeatable.")
    ] = None,
) -> Response:
    """A short-lived bearer for the Basic credentials (the API token as the password); the
    granted ``access`` lists the requested repositories the token may pull."""
    # A bearer of the flow never mints another (it would outlive itself); the API token may.
    principal = await service.authenticate(
        session, settings, authorization, allow_flow_bearer=False
    )
    minted = service.mint_bearer(settings, principal)
    access = service.granted_access(principal, scope or [])
    record(
        session,
        action="oci.token",
        actor=principal,
        target_type="token",
        target_id=principal.token_id,
        access=access,
        expires_in=minted.expires_in,
    )
    body = {
        "token": minted.token,
        "access_token": minted.token,
        "expires_in": minted.expires_in,
        "access": access,
    }
    return Response(
        json.dumps(body).encode(),
        media_type="application/json",
        headers={"Cache-Control": "no-store", **API_VERSION_HEADER},
    )


async def _caller(
    session: SessionDep, settings: SettingsDep, repository: str, authorization: str | None
) -> tuple[Principal, str]:
    principal = await service.authenticate(session, settings, authorization, repository)
    return principal, service.check_repository(principal, repository)


def _manifest_response(document: Document, *, head: bool) -> Response:
    return Response(
        b"" if head else document.body,
        media_type=document.media_type,
        headers={
            **API_VERSION_HEADER,
            "Docker-Content-Digest": document.digest,
            "ETag": f'"{document.digest}"',
            "Content-Length": str(len(document.body)),
        },
    )


async def get_manifest(
    namespace: str,
    name: str,
    reference: str,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    authorization: Authorization = None,
) -> Response:
    principal, repository = await _caller(session, settings, f"{namespace}/{name}", authorization)
    model, subject, document = await service.read_manifest(
        session, principal, repository, reference
    )
    head = request.method == "HEAD"
    if not head:
        _audit(
            request,
            action="oci.manifest",
            actor=principal,
            target_type=subject.kind,
            target_id=subject.id,
            model=model,
            version=subject.version,
            reference=reference,
            digest=document.digest,
        )
    return _manifest_response(document, head=head)


def _document_blob(
    document: Document, digest: str, *, head: bool, range_header: str | None
) -> Response:
    size = len(document.body)
    headers = {
        **API_VERSION_HEADER,
        "Docker-Content-Digest": digest,
        "Accept-Ranges": "bytes",
        "ETag": f'"{digest}"',
    }
    try:
        ranges = parse_range(range_header, size)
    except RangeNotSatisfiable as exc:
        raise OciError(
            416, "RANGE_INVALID", "requested range is outside the blob", headers=exc.headers
        ) from exc
    status, body = 200, document.body
    if ranges is not None and len(ranges) == 1:
        only = ranges[0]
        status, body = 206, document.body[only.start : only.end + 1]
        headers["Content-Range"] = f"bytes {only.start}-{only.end}/{size}"
    headers["Content-Length"] = str(len(body))
    return Response(
        b"" if head else body, status_code=status, media_type=document.media_type, headers=headers
    )


async def get_blob(
    namespace: str,
    name: str,
    digest: str,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    storages: StoragesDep,
    authorization: Authorization = None,
    range: Annotated[str | None, Header(include_in_schema=False)] = None,
    if_range: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    principal, repository = await _caller(session, settings, f"{namespace}/{name}", authorization)
    model, found = await service.read_blob(session, principal, repository, digest)
    head = request.method == "HEAD"
    if isinstance(found, Document):
        return _document_blob(found, digest, head=head, range_header=range)
    subject, file = found
    try:
        # As resolve: no URL into (nor bytes from) a store this process last found down.
        storages.require_up(subject.storage)
    except ServiceUnavailable as exc:
        raise unavailable(exc) from exc
    digest_headers = {**API_VERSION_HEADER, "Docker-Content-Digest": digest}
    direct = direct_urls(storages, subject.storage)
    if direct is not None and head:
        # The rows know the size: no round trip to the object store for a HEAD.
        return Response(
            b"",
            media_type=BLOB_MEDIA_TYPE,
            headers={**digest_headers, "Content-Length": str(file.size), "Accept-Ranges": "bytes"},
        )
    if direct is not None:
        # A backend that signs its own GETs (presigned S3) serves the bytes itself: a redirect,
        # as the spec allows (clients follow it; to another host without their Authorization).
        url = await direct(file.storage_key, settings.security.default_url_ttl_seconds)
        if url:
            _audit_blob(request, principal, model, subject, file, digest, range)
            return Response(status_code=307, headers={**digest_headers, "Location": str(url)})
    try:
        blob = await open_stored(storages, subject.storage, file.storage_key)
    except NotFound as exc:  # the row outlived its bytes: as unknown, never a 5xx
        raise blob_unknown(model, digest) from exc
    if blob.size != file.size:
        blob.close()
        raise blob_unknown(model, digest)
    try:
        response = respond(
            blob,
            subject.storage,
            method=request.method,
            range_header=range,
            if_range=if_range,
            media_type=BLOB_MEDIA_TYPE,
        )
    except RangeNotSatisfiable as exc:
        raise OciError(
            416, "RANGE_INVALID", "requested range is outside the blob", headers=exc.headers
        ) from exc
    response.raw_headers += [
        (b"docker-content-digest", digest.encode()),
        (b"docker-distribution-api-version", b"registry/2.0"),
    ]
    if not head:
        _audit_blob(request, principal, model, subject, file, digest, range)
    return response


def _audit_blob(
    request: Request,
    principal: Principal,
    model: str,
    subject: Subject,
    file: modelpack.File,
    digest: str,
    range_header: str | None,
) -> None:
    _audit(
        request,
        action="oci.blob",
        actor=principal,
        target_type=subject.kind,
        target_id=subject.id,
        model=model,
        version=subject.version,
        path=file.path,
        digest=digest,
        range=range_header,
    )


async def list_tags(
    namespace: str,
    name: str,
    session: SessionDep,
    settings: SettingsDep,
    authorization: Authorization = None,
    n: Annotated[str | None, Query(description="At most this many tags (≤ 1000).")] = None,
    last: Annotated[str | None, Query(description="Tags after this one.")] = None,
) -> Response:
    _, repository = await _caller(session, settings, f"{namespace}/{name}", authorization)
    model, tags, more = await service.read_tags(session, repository, n, last)
    headers = dict(API_VERSION_HEADER)
    if more and tags:
        following = f"/v2/{model}/tags/list?n={n}&last={quote(tags[-1], safe='')}"
        headers["Link"] = f'<{following}>; rel="next"'
    return Response(
        json.dumps({"name": model, "tags": tags}).encode(),
        media_type="application/json",
        headers=headers,
    )


def _oci_error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}}


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "OciErrors",
    "description": "The OCI distribution spec's error body.",
    "required": ["errors"],
    "properties": {
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "detail": {},
                },
            },
        }
    },
}
_UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: _oci_error("UNAUTHORIZED, with the WWW-Authenticate challenge.")
}
_REPOSITORY_ERRORS: dict[int | str, dict[str, Any]] = {
    **_UNAUTHORIZED,
    403: _oci_error("DENIED: another namespace, or a scope the token lacks."),
    404: _oci_error("NAME_UNKNOWN, MANIFEST_UNKNOWN or BLOB_UNKNOWN."),
}


def _json(description: str, media_type: str = "application/json") -> dict[str, Any]:
    return {"description": description, "content": {media_type: {"schema": {"type": "object"}}}}


def _binary(description: str) -> dict[str, Any]:
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {
        "description": description,
        "content": {"application/octet-stream": binary, modelpack.CONFIG_MEDIA_TYPE: binary},
    }


def _get_and_head(
    path: str, endpoint: Any, name: str, summary: str, responses: dict[int | str, Any]
) -> None:
    # GET and HEAD as two operations (one handler), so the OpenAPI operation ids stay unique.
    for method in ("GET", "HEAD"):
        router.add_api_route(
            path,
            endpoint,
            methods=[method],
            operation_id=f"oci_{method.lower()}_{name}",
            summary=f"OCI: {summary}" if method == "GET" else f"OCI: headers of {summary}",
            response_class=Response,
            responses=responses,
        )


_get_and_head(
    "/",
    version_check,
    "version_check",
    "the version check (is this a registry, are these credentials good)",
    {200: _json("Credentials accepted: `{}`."), **_UNAUTHORIZED},
)
router.add_api_route(
    "/token",
    token,
    methods=["GET"],
    operation_id="oci_token",
    summary="OCI: token flow (the API token as the Basic password → a short-lived bearer)",
    response_class=Response,
    responses={200: _json("`token`, `access_token`, `expires_in`, `access`."), **_UNAUTHORIZED},
)
_get_and_head(
    "/{namespace}/{name}/manifests/{reference}",
    get_manifest,
    "manifest",
    "a ModelPack manifest by tag (a source or variant name) or digest",
    {200: _json("The manifest.", modelpack.MANIFEST_MEDIA_TYPE), **_REPOSITORY_ERRORS},
)
_get_and_head(
    "/{namespace}/{name}/blobs/{digest}",
    get_blob,
    "blob",
    "a blob by digest (a file of the repository, or a manifest's config)",
    {
        200: _binary("The blob."),
        206: _binary("The requested range."),
        307: {"description": "Where the storage serves it (a presigned URL)."},
        400: _oci_error("DIGEST_INVALID."),
        **_REPOSITORY_ERRORS,
        416: _oci_error("RANGE_INVALID."),
    },
)
router.add_api_route(
    "/{namespace}/{name}/tags/list",
    list_tags,
    methods=["GET"],
    operation_id="oci_tags_list",
    summary="OCI: the tags of a repository, in lexical order (`n`, `last`, `Link`)",
    response_class=Response,
    responses={
        200: _json("`{name, tags}`."),
        400: _oci_error("PAGINATION_NUMBER_INVALID."),
        **_REPOSITORY_ERRORS,
    },
)


@router.api_route(
    "/{path:path}",
    methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"],
    include_in_schema=False,
)
async def not_served(path: str, request: Request) -> Response:
    """Push (uploads, manifest PUT, deletes): 405 UNSUPPORTED; any other path: NAME_UNKNOWN."""
    if request.method not in ("GET", "HEAD"):
        raise unsupported(request.method)
    parts = path.split("/")
    if path == "_catalog":
        raise OciError(404, "UNSUPPORTED", "the catalog is not served; list models on /api/v1")
    raise name_unknown("/".join(parts[:-2]) if len(parts) > 2 else path)
