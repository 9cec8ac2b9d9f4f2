"""What the registry (or the way to it) answered instead of success, as exception classes
keyed by the problem's stable ``code`` and HTTP status (``error_from_response``)."""

from __future__ import annotations

from typing import Any

import httpx


class RegistryError(Exception):
    """Anything the registry (or the way to it) answered with instead of success."""

    code = "registry_error"
    hint = ""

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        status: int | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.status = status
        self.problem = problem or {}

    def __str__(self) -> str:
        where = f"HTTP {self.status}, " if self.status else ""
        text = f"{self.detail} ({where}{self.code})"
        return f"{text} — {self.hint}" if self.hint else text


class ConnectionFailed(RegistryError):
    code = "connection_failed"


class AuthenticationError(RegistryError):
    code = "unauthorized"
    hint = "run `tensor-registry login`, pass --token or set TENSOR_REGISTRY_TOKEN"


class PermissionDenied(RegistryError):
    code = "forbidden"


class InsufficientScope(PermissionDenied):
    code = "insufficient_scope"
    hint = "ask an admin for a token with that scope"


class NamespaceForbidden(PermissionDenied):
    code = "namespace_forbidden"


class SignatureInvalid(PermissionDenied):
    code = "signature_invalid"


class SignatureExpired(PermissionDenied):
    code = "signature_expired"
    hint = "resolve again for fresh URLs"


class NotFound(RegistryError):
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class VersionNotFound(NotFound):
    code = "version_not_found"


class AliasNotFound(NotFound):
    code = "alias_not_found"


class ArtifactNotFound(NotFound):
    code = "artifact_not_found"


class ArtifactGone(NotFound):
    """The artifact a download started with is no longer served (re-resolve pinned to it)."""

    code = "artifact_gone"


class JobNotFound(NotFound):
    code = "job_not_found"


class NoMatchingArtifact(NotFound):
    code = "no_matching_artifact"

    @property
    def available(self) -> list[dict[str, Any]]:
        return list(self.problem.get("available") or [])

    @property
    def versions_with_match(self) -> list[int]:
        return list(self.problem.get("versions_with_match") or [])

    def __str__(self) -> str:
        text = super().__str__()
        if self.available:
            variants = ", ".join(
                f"v{a['version']} {a['dtype']}/{a['format']}/tp{a['tensor_parallel_size']}"
                f"{'/encrypted' if a.get('encrypted') else ''} ({a['status']})"
                for a in self.available
            )
            text += f"; available: {variants}"
        if self.versions_with_match:
            text += f"; versions with a match: {', '.join(map(str, self.versions_with_match))}"
        return text


class Conflict(RegistryError):
    code = "conflict"


class PreconditionFailed(RegistryError):
    code = "precondition_failed"


class InvalidRequest(RegistryError):
    code = "invalid"


class ServerError(RegistryError):
    code = "internal_error"


class ServiceUnavailable(ServerError):
    code = "service_unavailable"
    hint = "retry shortly"


class ChecksumMismatch(RegistryError):
    """Downloaded bytes do not hash to the sha256 the registry recorded."""

    code = "checksum_mismatch"


class InvalidKey(RegistryError):
    """The key could not be fetched or has the wrong shape."""

    code = "invalid_key"


class WrongKey(RegistryError):
    """The artifact does not decrypt with the key (or its encrypted data was altered)."""

    code = "decryption_failed"


class KeyAccessRequired(PermissionDenied):
    code = "key_access_required"
    hint = "an encrypted artifact needs a token with the 'keys:read' scope"


_BY_CODE: dict[str, type[RegistryError]] = {
    cls.code: cls
    for cls in (
        AuthenticationError,
        InsufficientScope,
        NamespaceForbidden,
        SignatureInvalid,
        SignatureExpired,
        ModelNotFound,
        VersionNotFound,
        AliasNotFound,
        ArtifactNotFound,
        JobNotFound,
        NoMatchingArtifact,
        ServiceUnavailable,
    )
}
_BY_STATUS: dict[int, type[RegistryError]] = {
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    400: InvalidRequest,
    411: InvalidRequest,
    413: InvalidRequest,
    415: InvalidRequest,
    416: InvalidRequest,
    422: InvalidRequest,
    503: ServiceUnavailable,
}


def error_from_response(response: httpx.Response) -> RegistryError:
    problem: dict[str, Any] = {}
    try:
        parsed = response.json()
        if isinstance(parsed, dict):
            problem = parsed
    except ValueError:
        pass
    status = response.status_code
    code = str(problem.get("code") or "")
    detail = str(problem.get("detail") or response.reason_phrase or f"HTTP {status}")
    if status in (401,) and not code:
        code = "unauthorized"
    cls = (
        _BY_CODE.get(code)
        or _BY_STATUS.get(status)
        or (ServerError if status >= 500 else RegistryError)
    )
    return cls(detail, code=code or None, status=status, problem=problem)


class ResponseTooLarge(RegistryError):
    """An answer went past the bytes its kind may have (a key, a JSON document, a file of the
    signed size): reading stopped there."""

    code = "response_too_large"


class TransferTimeout(ConnectionFailed):
    """A transfer went past its deadline (derived from its size) or stayed idle too long."""

    code = "transfer_timeout"
