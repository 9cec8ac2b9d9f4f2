"""``/v2/``: the OCI distribution spec's read side (pull), over the registry's own rows.

Routes: the version check (``GET /v2/``), the token flow (``GET /v2/token``), manifests by tag
or digest, blobs by digest (``Range`` and ``If-Range`` as the blob path serves them), and
``tags/list`` with ``n``/``last``. Every other method on ``/v2/…`` answers 405 ``UNSUPPORTED``:
this door is read-only. Errors use the spec's body (app.oci_door.errors), not problem+json.

Blob bytes take the registry's one serving path (app.blobs.service): a local file goes out with
``sendfile`` (zero-copy), any other backend streams; nothing is copied or re-hashed. What each
read grants is written to the audit log like a resolve (write-behind, app.resolve.audit_buffer);
each token-flow bearer issued is written in the request's own transaction.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request, Response

from app.audit.service import record
from app.auth import Principal
from app.blobs.service import RangeNotSatisfiable, open_stored, parse_range, respond
from app.db import SessionDep
from app.deps import SettingsDep, StoragesDep
from app.oci_door import modelpack, service
from app.oci_door.errors import (
    API_VERSION_HEADER,
    OciError,
    OciRoute,
    blob_unknown,
    name_unknown,
    unsupported,
)
from app.oci_door.modelpack import Document, Subject
from app.resolve.render import direct_urls

router = APIRouter(prefix="/v2", tags=["oci"], route_class=OciRoute)

Authorization = Annotated[str | None, Header(include_in_schema=False)]
BLOB_MEDIA_TYPE = "application/octet-stream"


def _audit(request: Request, **row: Any) -> None:
    buffer = getattr(request.app.state, "resolve_audit", None)
    if buffer is not None:
        buffer.add(**row)


@router.api_route("/", methods=["GET", "HEAD"], summary="OCI: version check")
async def version_check(
    session: SessionDep, settings: SettingsDep, authorization: Authorization = None
) -> Response:
    await service.authenticate(session, settings, authorization)
    return Response(b"{}", media_type="application/json", headers=API_VERSION_HEADER)


@router.get("/token", summary="OCI: token flow (API token as the Basic password)")
async def token(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    authorization: Authorization = None,
    scope: Annotated[list[str] | None, Query(max_length=16)] = None,
    service_name: Annotated[str | None, Query(alias="service", max_length=256)] = None,
) -> Response:
    """A short-lived bearer for the Basic credentials (the API token as the password); the
    granted ``access`` lists the requested repositories the token may pull."""
    principal = await service.authenticate(session, settings, authorization, allow_bearer=False)
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


@router.api_route(
    "/{namespace}/{name}/manifests/{reference}",
    methods=["GET", "HEAD"],
    summary="OCI: a manifest by tag (source or variant name) or digest",
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
    model_id, model = await service.model_row(session, repository)
    subject: Subject
    if reference.startswith("sha256:"):
        kinds = service.allowed_kinds(principal)
        subject, document = await service.manifest_by_digest(
            session, model_id, model, reference, kinds
        )
    else:
        subject = await service.subject_by_tag(session, model_id, model, reference)
        service.require_kind(principal, subject.kind)
        document = modelpack.manifest(subject)
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


@router.api_route(
    "/{namespace}/{name}/blobs/{digest}",
    methods=["GET", "HEAD"],
    summary="OCI: a blob (a file of the repository, or a manifest's config) by digest",
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
    model_id, model = await service.model_row(session, repository)
    found = await service.find_blob(session, model_id, model, digest, principal)
    head = request.method == "HEAD"
    if isinstance(found, Document):
        return _document_blob(found, digest, head=head, range_header=range)
    subject, file = found
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
        # as the spec allows (clients follow it and drop their Authorization header).
        url = await direct(file.storage_key, settings.security.default_url_ttl_seconds)
        if url:
            _audit_blob(request, principal, model, subject, file, digest, range)
            return Response(status_code=307, headers={**digest_headers, "Location": str(url)})
    try:
        blob = await open_stored(storages, subject.storage, file.storage_key)
    except Exception as exc:
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


@router.get("/{namespace}/{name}/tags/list", summary="OCI: the tags of a repository")
async def list_tags(
    namespace: str,
    name: str,
    session: SessionDep,
    settings: SettingsDep,
    authorization: Authorization = None,
    n: Annotated[str | None, Query(max_length=16)] = None,
    last: Annotated[str | None, Query(max_length=256)] = None,
) -> Response:
    _, repository = await _caller(session, settings, f"{namespace}/{name}", authorization)
    model_id, model = await service.model_row(session, repository)
    tags, more = service.page(await service.tags(session, model_id), n, last)
    headers = dict(API_VERSION_HEADER)
    if more and tags:
        following = f"/v2/{model}/tags/list?n={n}&last={quote(tags[-1], safe='')}"
        headers["Link"] = f'<{following}>; rel="next"'
    return Response(
        json.dumps({"name": model, "tags": tags}).encode(),
        media_type="application/json",
        headers=headers,
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
