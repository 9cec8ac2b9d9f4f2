"""GET /api/v1/resolve.

The hot path of a fleet rollout touches no database when it can: the token comes from a
few-seconds principal cache, the choice from the Redis resolve cache, the audit row goes to the
write-behind buffer. The session is opened only when something needs it (a cache miss, an
unknown token, a key URL whose issue must be durable first) and is owned by the route function
like SessionDep would own it: committed before the response is sent, rolled back on error.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from tensor_registry_server.auth import Principal, authenticate_cached, principal_cache
from tensor_registry_server.core.choice_cache import ResolveCache
from tensor_registry_server.core.db import LazySession
from tensor_registry_server.resolve import service
from tensor_registry_server.resolve.choice import CHOICE_ORDER
from tensor_registry_server.resolve.schemas import ResolveOut, ResolveQuery

router = APIRouter(prefix="/api/v1", tags=["resolve"])


async def resolve_principal(request: Request, sessions: LazySession) -> Principal:
    """The caller, through the process's principal cache (tensor_registry_server.auth), with the
    resolve scope."""
    principal = await authenticate_cached(request, principal_cache(request), sessions.get)
    principal.require_scope("resolve")
    return principal


def parse_query(request: Request) -> ResolveQuery:
    """The query string as a ResolveQuery; errors render exactly like FastAPI's own 422s.

    Parsed here rather than by FastAPI's per-parameter machinery, which costs more than the
    rest of a cached resolve; the OpenAPI parameters are generated from the same model.
    """
    items = request.query_params.multi_items()
    values = dict(items)
    if len(values) != len(items):
        repeated = sorted({k for k, _ in items if sum(1 for key, _ in items if key == k) > 1})
        raise RequestValidationError(
            [
                {"loc": ("query", k), "msg": "given more than once", "type": "repeated"}
                for k in repeated
            ]
        )
    try:
        return ResolveQuery.model_validate(values)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**err, "loc": ("query", *err["loc"])} for err in exc.errors(include_url=False)]
        ) from exc


def _query_parameters() -> list[dict[str, Any]]:
    schema = ResolveQuery.model_json_schema()
    required = set(schema.get("required", []))
    parameters = []
    for name, prop in schema["properties"].items():
        prop = dict(prop)
        description = prop.pop("description", None)
        prop.pop("title", None)
        parameter: dict[str, Any] = {
            "name": name,
            "in": "query",
            "required": name in required,
            "schema": prop,
        }
        if description:
            parameter["description"] = description
        parameters.append(parameter)
    return parameters


@router.get(
    "/resolve",
    response_model=ResolveOut,
    summary="Signed URLs and loader settings for a serving node",
    description="Needs the `resolve` scope and the model's namespace. Unknown query parameters "
    "are refused (422), so a typo cannot silently widen the choice.\n\n"
    f"Which artifact: {CHOICE_ORDER}. Adding an encrypted variant therefore never "
    "changes what a resolve without `encrypted=` returns; ask `encrypted=true` for the "
    "encrypted one. The key URL is only given to tokens with `keys:read`; without it an "
    "encrypted artifact is still returned (the node supplies the key file itself).",
    openapi_extra={"parameters": _query_parameters()},
    responses={
        401: {"description": "`missing_token`, `invalid_token`, `token_expired`."},
        403: {"description": "`insufficient_scope`, `namespace_forbidden`."},
        404: {
            "description": "`model_not_found`, `alias_not_found`, `version_not_found`, or "
            "`no_matching_artifact` (with `available` variants and `versions_with_match`)."
        },
        422: {
            "description": "`invalid_ref`, `invalid_model_name`, `ttl_too_long`, "
            "`validation_error`."
        },
    },
)
async def resolve(request: Request) -> Response:
    state = request.app.state
    cache: ResolveCache | None = getattr(state, "resolve_cache", None)
    # This function is the boundary: the session (if one was needed) commits when the block
    # ends, before the response exists; an error rolls it back. No FastAPI dependencies here:
    # on a cache hit, solving them would cost more than the lookup itself.
    async with AsyncExitStack() as stack:
        sessions = LazySession(state.sessionmaker, stack)
        principal = await resolve_principal(request, sessions)
        query = parse_query(request)
        payload, cached = await service.resolve(
            sessions.get,
            principal,
            query,
            settings=state.settings,
            storages=state.storages,
            cache=cache,
            audit=getattr(state, "resolve_audit", None),
        )
    # Signed URLs are per-caller capabilities: no shared cache may keep them.
    headers = {"Cache-Control": "no-store"}
    if cache is not None:
        headers["X-Resolve-Cache"] = "hit" if cached else "miss"
    return Response(
        payload,
        media_type="application/json",
        headers=headers,
    )
