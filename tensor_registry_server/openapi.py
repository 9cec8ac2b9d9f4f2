"""The OpenAPI document, with what routes really answer besides their success response.

FastAPI declares only the success response and a JSON 422. Every error this API sends is
``application/problem+json`` (tensor_registry_server/core/errors.py), so the document adds, per
operation, the
problem responses it can give (shared ``components/responses``, one ``Problem`` schema) and a
``default`` problem response for the rarer ones (405, 411, 412, 409 …), and fixes the media
types of the routes that do not answer JSON (blobs, keys, SSE, /metrics).

Authentication is declared as it works: an HTTP bearer scheme (``bearerAuth``, the API token)
required by every ``/api/v1/`` operation except the signed blob and key URLs, which carry their
own signature. Swagger UI shows its Authorize button from it and sends the token with
"Try it out".
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from tensor_registry_server.core.errors import PROBLEM_JSON, PROBLEM_SCHEMA

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
PROBLEM_STATUSES = (400, 401, 403, 404, 409, 412, 413, 415, 416, 422, 429, 503, 507)
BINARY = {"schema": {"type": "string", "format": "binary"}}
BLOB_PREFIXES = ("/api/v1/blobs/", "/api/v1/keys/")
BODY_METHODS = {"post", "put", "patch"}
# Doors that speak another spec answer errors in that spec's body, as their routes declare
# (the OCI distribution door: ``{"errors": [...]}``); only ``default`` stays problem+json.
OWN_ERROR_BODIES = ("/v2/",)
BEARER = "bearerAuth"
BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "An API token (trg_...): `Authorization: Bearer trg_...`.",
}


def _problem_content() -> dict[str, Any]:
    return {PROBLEM_JSON: {"schema": PROBLEM_REF}}


DEFAULT_PROBLEM = {
    "description": "Any other error (problem details).",
    "content": _problem_content(),
}


def _shared_responses() -> dict[str, Any]:
    return {
        f"Problem{status}": {
            "description": f"{HTTPStatus(status).phrase} (problem details).",
            "content": _problem_content(),
        }
        for status in PROBLEM_STATUSES
    }


def _statuses_for(path: str, method: str, operation: dict[str, Any]) -> set[int]:
    """The problem statuses every operation of this shape can answer."""
    statuses = {503}  # a dependency (database, storage, broker) is down
    params = operation.get("parameters") or []
    if "{" in path:
        statuses.add(404)
    if params or "requestBody" in operation:
        statuses.add(422)
    if path.startswith(BLOB_PREFIXES):
        statuses.add(403)  # signature_invalid / signature_expired
        if path.startswith("/api/v1/blobs/"):
            statuses.add(416)
    elif path.startswith("/api/v1/"):
        statuses.update((401, 403, 429))  # 429: the token's request rate (limits.rate)
    if method in BODY_METHODS:
        statuses.update((413, 415, 507))  # 507: the namespace's storage quota
    return statuses


def _as_problem(response: dict[str, Any]) -> dict[str, Any]:
    return {"description": response.get("description") or "Problem.", "content": _problem_content()}


def _fix_media_types(path: str, method: str, responses: dict[str, Any]) -> None:
    if path == "/metrics":
        responses["200"] = {
            "description": "Prometheus text exposition format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    elif path.startswith(BLOB_PREFIXES):
        for status in ("200", "206") if path.startswith("/api/v1/blobs/") else ("200",):
            entry = responses.setdefault(status, {"description": HTTPStatus(int(status)).phrase})
            entry["content"] = {"application/octet-stream": BINARY}
    elif path == "/readyz":
        status_body = {
            "schema": {
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["ready", "unavailable"]},
                    "checks": {"type": "object", "additionalProperties": {"type": "string"}},
                    "workers": {"type": "object"},
                },
            }
        }
        responses["200"] = {"description": "Ready.", "content": {"application/json": status_body}}
        responses["503"] = {
            "description": "A check failed (Retry-After is set); the failing checks say why.",
            "content": {"application/json": status_body},
        }


def document(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    components = doc.setdefault("components", {})
    components.setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    components.setdefault("responses", {}).update(_shared_responses())
    components.setdefault("securitySchemes", {})[BEARER] = BEARER_SCHEME
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            if path.startswith("/api/v1/") and not path.startswith(BLOB_PREFIXES):
                operation.setdefault("security", [{BEARER: []}])
            responses: dict[str, Any] = operation.setdefault("responses", {})
            system = path in ("/healthz", "/readyz", "/metrics")
            own_errors = path.startswith(OWN_ERROR_BODIES)
            for status, response in list(responses.items()):
                # A request that fails validation is answered by the app-wide handler, as
                # problem+json, on every route (a door's own error bodies start after it).
                if status.isdigit() and int(status) >= 400 and (not own_errors or status == "422"):
                    responses[status] = _as_problem(response)
            if not system and not own_errors:
                for code in sorted(_statuses_for(path, method, operation)):
                    responses.setdefault(
                        str(code), {"$ref": f"#/components/responses/Problem{code}"}
                    )
            _fix_media_types(path, method, responses)
            responses.setdefault("default", DEFAULT_PROBLEM)
    components["schemas"].pop("HTTPValidationError", None)
    components["schemas"].pop("ValidationError", None)
    return doc


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
