"""The Hugging Face door's routes: what ``huggingface_hub`` sends when ``HF_ENDPOINT`` is the
registry (``snapshot_download``, ``hf_hub_download``, ``model_info``, ``list_repo_files``,
``list_repo_tree``, ``list_repo_refs``, ``whoami``, the ``hf download`` CLI, transformers'
``from_pretrained``).

File bytes never pass through Python twice: ``HEAD``/``GET .../resolve/REV/PATH`` answers with
the blob serving path (tensor_registry_server.blobs: ``os.sendfile`` for local files, ``Range`` →
206) carrying the
Hub's headers, or, where the storage hands out its own short-lived URLs (presigned S3), with a
302 to that URL and the file's size and sha256 in ``X-Linked-Size`` / ``X-Linked-Etag``, which is
how the Hub points at its CDN: the client downloads from the storage and drops the token there.

Audit: a file handed out (its bytes served by GET, or a storage URL issued) writes the row
resolve writes, ``action=resolve``, with ``door=hf``, the path and the commit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal, authenticate_cached, principal_cache
from tensor_registry_server.blobs.service import BlobResponse, open_stored, requested_ranges
from tensor_registry_server.core.db import LazySession
from tensor_registry_server.hf_door import service
from tensor_registry_server.hf_door.errors import hub_errors
from tensor_registry_server.resolve.render import direct_urls

router = APIRouter(tags=["hugging-face-door"])

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: {"description": "No token, or an invalid one (`X-Error-Message` says which)."},
    403: {"description": "`insufficient_scope`."},
    404: {
        "description": "`X-Error-Code: RepoNotFound` (also for a namespace the token may not "
        "see), `RevisionNotFound` or `EntryNotFound`."
    },
}
_JSON_HEADERS = {"Cache-Control": "private, no-cache"}
_BINARY = {"schema": {"type": "string", "format": "binary"}}


@asynccontextmanager
async def _door(request: Request, name: str) -> AsyncIterator[tuple[LazySession, Principal]]:
    """The caller and a session opened on first use, committed when the block ends (before the
    response is sent), errors rendered with the headers the Hub's clients read."""
    with hub_errors(name):
        async with AsyncExitStack() as stack:
            sessions = LazySession(request.app.state.sessionmaker, stack)
            principal = await authenticate_cached(request, principal_cache(request), sessions.get)
            yield sessions, principal


async def _info(request: Request, name: str, revision: str, files_metadata: bool) -> Response:
    async with _door(request, name) as (sessions, principal):
        snap = await service.find_snapshot(
            sessions.get, principal, name, revision, cache=request.app.state.resolve_cache
        )
        body = await service.repo_info(await sessions.get(), snap, files_metadata=files_metadata)
    return JSONResponse(body, headers=_JSON_HEADERS)


Blobs = Annotated[
    bool, Query(description="Include each file's size, blob id and LFS sha256 (`siblings`).")
]


@router.get(
    "/api/models/{namespace}/{name}",
    summary="Hugging Face door: model info at `main` (the latest version)",
    responses=_PROBLEMS,
)
async def model_info(namespace: str, name: str, request: Request, blobs: Blobs = False) -> Response:
    return await _info(request, f"{namespace}/{name}", "main", blobs)


@router.get(
    "/api/models/{namespace}/{name}/revision/{revision}",
    summary="Hugging Face door: model info at a revision",
    description="`revision`: a version number, an alias, `latest` or `main`, optionally with a "
    "variant (`prod.bfloat16.hf.tp1`, `3.float16.vllm.tp2.enc`), or a commit this door gave. "
    "`sha` is that snapshot's 40-hex commit; `siblings` its files.",
    responses=_PROBLEMS,
)
async def model_info_at(
    namespace: str, name: str, revision: str, request: Request, blobs: Blobs = False
) -> Response:
    return await _info(request, f"{namespace}/{name}", revision, blobs)


async def _tree(
    request: Request,
    name: str,
    revision: str,
    path: str,
    *,
    recursive: bool,
    expand: bool,
    limit: int,
    cursor: int,
) -> Response:
    async with _door(request, name) as (sessions, principal):
        snap = await service.find_snapshot(
            sessions.get, principal, name, revision, cache=request.app.state.resolve_cache
        )
        entries = service.tree_entries(snap, path, recursive=recursive, expand=expand)
    page = entries[cursor : cursor + limit]
    headers = dict(_JSON_HEADERS)
    if cursor + limit < len(entries):
        # The GitHub-style link the client follows, with every query parameter kept.
        following = request.url.include_query_params(cursor=cursor + limit, limit=limit)
        headers["Link"] = f'<{following}>; rel="next"'
    return JSONResponse(page, headers=headers)


Limit = Annotated[int, Query(ge=1, le=service.TREE_PAGE_SIZE, description="Page size.")]
Cursor = Annotated[int, Query(ge=0, le=10**9, description="Where the page starts.")]

_TREE_DESCRIPTION = (
    "Files and folders of a revision, as the Hub lists them (every file as an LFS file: `lfs.oid` "
    "is its sha256). Pages of at most 1000 entries (`limit` asks fewer); the next page is in "
    'the `Link: <…>; rel="next"` header.'
)


@router.get(
    "/api/models/{namespace}/{name}/tree/{revision}",
    summary="Hugging Face door: the files of a revision",
    description=_TREE_DESCRIPTION,
    responses=_PROBLEMS,
)
async def tree(
    namespace: str,
    name: str,
    revision: str,
    request: Request,
    recursive: bool = False,
    expand: bool = False,
    limit: Limit = service.TREE_PAGE_SIZE,
    cursor: Cursor = 0,
) -> Response:
    return await _tree(
        request,
        f"{namespace}/{name}",
        revision,
        "",
        recursive=recursive,
        expand=expand,
        limit=limit,
        cursor=cursor,
    )


@router.get(
    "/api/models/{namespace}/{name}/tree/{revision}/{path:path}",
    summary="Hugging Face door: the files of a folder of a revision",
    description=_TREE_DESCRIPTION,
    responses=_PROBLEMS,
)
async def tree_under(
    namespace: str,
    name: str,
    revision: str,
    path: str,
    request: Request,
    recursive: bool = False,
    expand: bool = False,
    limit: Limit = service.TREE_PAGE_SIZE,
    cursor: Cursor = 0,
) -> Response:
    return await _tree(
        request,
        f"{namespace}/{name}",
        revision,
        path,
        recursive=recursive,
        expand=expand,
        limit=limit,
        cursor=cursor,
    )


@router.get(
    "/api/models/{namespace}/{name}/refs",
    summary="Hugging Face door: branches (`main`, aliases) and tags (versions)",
    description="Each with its variants (`prod.bfloat16.hf.tp1` …) pointing at the artifact "
    "that name resolves to. Needs `models:read`.",
    responses=_PROBLEMS,
)
async def refs(namespace: str, name: str, request: Request, include_prs: bool = False) -> Response:
    full = f"{namespace}/{name}"
    async with _door(request, full) as (sessions, principal):
        principal.require_scope("models:read")
        full = service.checked_name(principal, full)
        body = await service.refs(await sessions.get(), full)
    if include_prs:
        body["pullRequests"] = []
    return JSONResponse(body, headers=_JSON_HEADERS)


@router.get(
    "/api/whoami-v2",
    summary="Hugging Face door: the token as a Hub user",
    responses={401: _PROBLEMS[401]},
)
async def whoami(request: Request) -> Response:
    async with _door(request, "") as (_, principal):
        body = service.whoami(principal)
    return JSONResponse(body, headers=_JSON_HEADERS)


async def resolve_file(
    namespace: str, name: str, revision: str, path: str, request: Request
) -> Response:
    state = request.app.state
    full = f"{namespace}/{name}"
    head = request.method == "HEAD"
    async with _door(request, full) as (sessions, principal):
        snap = await service.find_snapshot(
            sessions.get, principal, full, revision, cache=state.resolve_cache
        )
        stored = snap.file(path)
        state.storages.require_up(snap.storage)  # as resolve: 503 storage_unavailable
        ttl = state.settings.security.default_url_ttl_seconds
        direct = direct_urls(state.storages, snap.storage)
        location = await direct(stored.storage_key, ttl) if direct is not None else None
        if location or not head:
            row = service.audit_row(principal, snap, stored, redirect_ttl=ttl if location else None)
            audit = getattr(state, "resolve_audit", None)
            if audit is not None:
                audit.add(**row)
            else:
                record(await sessions.get(), **row)
    headers = {
        "x-repo-commit": snap.commit,
        "x-linked-size": str(stored.size),
        "x-linked-etag": f'"{stored.sha256}"',
    }
    if location:
        return Response(
            status_code=302,
            headers={
                **headers,
                "location": str(location),
                "etag": f'"{stored.sha256}"',
                "cache-control": "private, no-store",
            },
        )
    with hub_errors(full):
        blob = await open_stored(state.storages, snap.storage, stored.storage_key)
        try:
            # The file's sha256 is its identity in the client's cache (blobs/<etag>).
            blob.etag = f'"{stored.sha256}"'
            ranges = requested_ranges(
                blob, request.headers.get("range"), request.headers.get("if-range")
            )
            return BlobResponse(blob, snap.storage, ranges, head=head, extra_headers=headers)
        except BaseException:
            blob.close()
            raise


for _method in ("GET", "HEAD"):
    router.add_api_route(
        "/{namespace}/{name}/resolve/{revision}/{path:path}",
        resolve_file,
        methods=[_method],
        operation_id=f"{_method.lower()}_hf_resolve_file",
        summary=f"Hugging Face door: {'download' if _method == 'GET' else 'headers of'} a file "
        "of a revision",
        description="`X-Repo-Commit` (the revision's commit), `ETag` and `X-Linked-Etag` (the "
        "file's sha256), `Content-Length`/`X-Linked-Size`, `Range` → 206. Where the storage "
        "signs its own URLs, a 302 to one (the Hub's CDN redirect).",
        response_class=Response,
        responses={
            200: {"content": {"application/octet-stream": _BINARY, "application/json": _BINARY}},
            206: {
                "description": "The requested range(s).",
                "content": {"application/octet-stream": _BINARY, "application/json": _BINARY},
            },
            302: {"description": "To the storage's own short-lived URL for the file."},
            416: {"description": "`range_not_satisfiable`."},
            **_PROBLEMS,
        },
    )
