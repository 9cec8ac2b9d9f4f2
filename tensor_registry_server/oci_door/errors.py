"""Errors of the OCI door, in the distribution spec's body (not problem+json).

OCI clients read ``{"errors": [{"code", "message", "detail"}]}`` with the spec's codes, so the
door's routes use ``OciRoute``, which renders ``OciError`` that way; the rest of the API keeps
RFC 9457. Every 401 carries the ``WWW-Authenticate`` challenge that starts the token flow.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from tensor_registry_server.core.context import request_id_var
from tensor_registry_server.core.errors import AppError

API_VERSION_HEADER = {"Docker-Distribution-API-Version": "registry/2.0"}


class OciError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        detail: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        self.headers = headers or {}

    def response(self, *, head: bool = False) -> Response:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.detail is not None:
            error["detail"] = self.detail
        body = json.dumps(
            {"errors": [error], "request_id": request_id_var.get()}, separators=(",", ":")
        ).encode()
        headers = {**API_VERSION_HEADER, **self.headers, "Content-Length": str(len(body))}
        return Response(
            b"" if head else body,
            status_code=self.status,
            media_type="application/json",
            headers=headers,
        )


def name_unknown(repository: str) -> OciError:
    return OciError(
        404, "NAME_UNKNOWN", "repository name not known to registry", detail={"name": repository}
    )


def manifest_unknown(repository: str, reference: str) -> OciError:
    return OciError(
        404,
        "MANIFEST_UNKNOWN",
        "manifest unknown",
        detail={"name": repository, "reference": reference},
    )


def blob_unknown(repository: str, digest: str) -> OciError:
    return OciError(
        404,
        "BLOB_UNKNOWN",
        "blob unknown to registry",
        detail={"name": repository, "digest": digest},
    )


def denied(message: str) -> OciError:
    return OciError(403, "DENIED", message)


def unsupported(method: str) -> OciError:
    return OciError(
        405,
        "UNSUPPORTED",
        f"this registry is read-only: {method} is not supported",
        headers={"Allow": "GET, HEAD"},
    )


def unavailable(exc: AppError) -> OciError:
    """The registry's 503 (the blob's storage is down) as distribution's ``UNAVAILABLE``: the
    same status and ``Retry-After`` as resolve, the reason and storage in ``detail``."""
    return OciError(
        exc.status,
        "UNAVAILABLE",
        "service unavailable",
        detail={"code": exc.code, "reason": exc.detail, **exc.extra},
        headers=exc.headers,
    )


class OciRoute(APIRoute):
    """A route whose ``OciError`` becomes the spec's error body (HEAD: headers only)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def oci_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except OciError as exc:
                return exc.response(head=request.method == "HEAD")

        return oci_handler
