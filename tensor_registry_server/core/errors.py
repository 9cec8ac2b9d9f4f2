"""Domain errors and the one handler that renders them as RFC 9457 problem+json.

Services raise ``AppError`` subclasses carrying an HTTP status and a stable ``code``; they never
raise HTTPException. Everything else that can escape a request (validation errors, unknown
routes, integrity errors, a database that is down, bugs) is mapped here too, so that every 4xx/5xx
has the same shape and a ``request_id``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm.exc import StaleDataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tensor_registry_server.core.context import request_id_var

log = logging.getLogger("tensor_registry.errors")

PROBLEM_JSON = "application/problem+json"

# JSON Schema of every error body (problem_body), published as components/schemas/Problem.
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Problem",
    "description": "RFC 9457 problem details, plus a stable machine-readable `code`. Some "
    "codes add fields (e.g. `errors` for validation_error, `available` for "
    "no_matching_artifact, `missing` for no_capable_worker).",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "request_id": {"type": ["string", "null"]},
    },
    "additionalProperties": True,
}


class AppError(Exception):
    status: int = 500
    code: str = "internal_error"
    title: str = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        status: int | None = None,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if title is not None:
            self.title = title
        self.headers = headers or {}
        self.extra = extra


class BadRequest(AppError):
    status, code, title = 400, "bad_request", "Bad request"


class Unauthorized(AppError):
    status, code, title = 401, "unauthorized", "Authentication required"

    def __init__(self, detail: str, **kw: Any) -> None:
        kw.setdefault("headers", {"WWW-Authenticate": 'Bearer realm="tensor-registry"'})
        super().__init__(detail, **kw)


class Forbidden(AppError):
    status, code, title = 403, "forbidden", "Forbidden"


class NotFound(AppError):
    status, code, title = 404, "not_found", "Not found"


class Conflict(AppError):
    status, code, title = 409, "conflict", "Conflict"


class LengthRequired(AppError):
    status, code, title = 411, "length_required", "Content-Length required"


class PreconditionFailed(AppError):
    status, code, title = 412, "precondition_failed", "Precondition failed"


class PayloadTooLarge(AppError):
    status, code, title = 413, "payload_too_large", "Payload too large"


class Invalid(AppError):
    status, code, title = 422, "invalid", "Unprocessable content"


class ServiceUnavailable(AppError):
    status, code, title = 503, "service_unavailable", "Service unavailable"

    def __init__(self, detail: str, *, retry_after: int = 5, **kw: Any) -> None:
        kw.setdefault("headers", {"Retry-After": str(retry_after)})
        super().__init__(detail, **kw)


def problem_body(
    *, status: int, code: str, title: str, detail: str, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"urn:tensor-registry:problem:{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        "request_id": request_id_var.get(),
    }
    body.update(extra)
    return body


def problem_response(
    *,
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    return JSONResponse(
        problem_body(status=status, code=code, title=title, detail=detail, **extra),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


_HTTP_CODES = {
    400: ("bad_request", "Bad request"),
    401: ("unauthorized", "Authentication required"),
    403: ("forbidden", "Forbidden"),
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    406: ("not_acceptable", "Not acceptable"),
    408: ("request_timeout", "Request timeout"),
    411: ("length_required", "Content-Length required"),
    413: ("payload_too_large", "Payload too large"),
    415: ("unsupported_media_type", "Unsupported media type"),
    416: ("range_not_satisfiable", "Range not satisfiable"),
    422: ("invalid", "Unprocessable content"),
}


async def _app_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AppError)
    return problem_response(
        status=exc.status,
        code=exc.code,
        title=exc.title,
        detail=exc.detail,
        headers=exc.headers,
        **exc.extra,
    )


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": [str(part) for part in err.get("loc", ())],
            "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in exc.errors()
    ]
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"][1:] if len(first["loc"]) > 1 else first["loc"])
    return problem_response(
        status=422,
        code="validation_error",
        title="Request validation failed",
        detail=f"{where}: {first['msg']}" if where else str(first["msg"]),
        errors=errors,
    )


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code, title = _HTTP_CODES.get(exc.status_code, ("http_error", "HTTP error"))
    detail = exc.detail if isinstance(exc.detail, str) else title
    if exc.status_code == 404 and detail == "Not Found":
        detail = "No such route."
    return problem_response(
        status=exc.status_code,
        code=code,
        title=title,
        detail=detail,
        headers=dict(exc.headers or {}),
    )


async def _integrity_error(_: Request, exc: Exception) -> JSONResponse:
    log.info("integrity error mapped to 409: %s", type(exc).__name__)
    return problem_response(
        status=409,
        code="conflict",
        title="Conflict",
        detail="The request conflicts with the current state of the resource.",
    )


async def _stale_error(_: Request, exc: Exception) -> JSONResponse:
    return problem_response(
        status=412,
        code="precondition_failed",
        title="Precondition failed",
        detail="The resource was changed by another request; re-read it and retry.",
    )


async def _db_down(_: Request, exc: Exception) -> JSONResponse:
    log.error("database unavailable: %s", type(exc).__name__)
    return problem_response(
        status=503,
        code="database_unavailable",
        title="Service unavailable",
        detail="The database is not reachable; retry shortly.",
        headers={"Retry-After": "5"},
    )


def internal_error_body() -> dict[str, Any]:
    """Body for a bug; rendered by the request middleware so X-Request-Id is kept."""
    return problem_body(
        status=500,
        code="internal_error",
        title="Internal error",
        detail="An unexpected error occurred; it has been logged with this request_id.",
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(AppError, _app_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(IntegrityError, _integrity_error)
    app.add_exception_handler(StaleDataError, _stale_error)
    app.add_exception_handler(OperationalError, _db_down)
    app.add_exception_handler(InterfaceError, _db_down)
    app.add_exception_handler(ConnectionError, _db_down)
