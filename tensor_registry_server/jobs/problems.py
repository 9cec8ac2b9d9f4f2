"""A job's error as the API shows it: the problem format (RFC 9457 plus ``code``) that the
lifecycle, the runner and the job kinds write into ``Job.error``."""

from __future__ import annotations

from typing import Any

_TITLES = {
    "cancelled": "Job cancelled",
    "storage_unavailable": "Storage unavailable",
    "database_unavailable": "Database unavailable",
    "too_many_attempts": "Job abandoned",
    "internal_error": "Internal error",
}


def problem(
    code: str, detail: str, *, status: int = 422, title: str | None = None
) -> dict[str, Any]:
    """A job error in the API's problem format (RFC 9457 plus ``code``)."""
    return {
        "type": f"urn:tensor-registry:problem:{code}",
        "title": title or _TITLES.get(code, "Job failed"),
        "status": status,
        "detail": detail,
        "code": code,
    }
