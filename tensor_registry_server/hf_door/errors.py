"""Errors as the Hub's clients read them.

``huggingface_hub`` turns an error response into its own exceptions by the ``X-Error-Code``
header (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``) and, for a 401,
by ``X-Error-Message``: "Invalid credentials in Authorization header" is a bad token, any other
401 on a repo URL reads as a repository that is not found (private). The body stays the
registry's problem+json with its stable ``code``; these headers are added to it.

A token limited to other namespaces gets exactly the answer of a model that does not exist
(404 ``RepoNotFound``), as on the Hub for a private repo: the door tells it nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from tensor_registry_server.core.errors import AppError, NotFound

REPO_NOT_FOUND = "RepoNotFound"
REVISION_NOT_FOUND = "RevisionNotFound"
ENTRY_NOT_FOUND = "EntryNotFound"
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"

_REPO_CODES = {"model_not_found", "invalid_model_name"}
_REVISION_CODES = {
    "invalid_ref",
    "alias_not_found",
    "version_not_found",
    "no_matching_artifact",
    "revision_not_found",
}
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def header_text(text: str) -> str:
    """``text`` as a header value: printable ASCII, one line, bounded."""
    return _PRINTABLE.sub("?", text)[:300]


def repo_not_found(name: str) -> NotFound:
    return NotFound(
        f"Repository '{name}' not found.",
        code="model_not_found",
        headers={"X-Error-Code": REPO_NOT_FOUND, "X-Error-Message": "Repository not found"},
    )


def entry_not_found(path: str, commit: str) -> NotFound:
    # With the commit, the client records the file's absence in its cache (.no_exist/<commit>/),
    # so transformers' probes for optional files are asked once per snapshot.
    return NotFound(
        f"No file '{path}' in this revision.",
        code="entry_not_found",
        headers={
            "X-Error-Code": ENTRY_NOT_FOUND,
            "X-Error-Message": "Entry not found",
            "X-Repo-Commit": commit,
        },
    )


def as_hub_error(exc: AppError, name: str) -> AppError:
    if exc.code == "namespace_forbidden" or exc.code in _REPO_CODES:
        return repo_not_found(name)
    if exc.code in _REVISION_CODES:
        return NotFound(
            exc.detail,
            code=exc.code,
            headers={
                **exc.headers,
                "X-Error-Code": REVISION_NOT_FOUND,
                "X-Error-Message": "Invalid rev id",
            },
            **exc.extra,
        )
    if exc.code in ("invalid_token", "token_expired"):
        exc.headers = {**exc.headers, "X-Error-Message": INVALID_CREDENTIALS}
    elif exc.code == "missing_token":
        exc.headers = {**exc.headers, "X-Error-Code": REPO_NOT_FOUND}
    elif "X-Error-Message" not in exc.headers:
        exc.headers = {**exc.headers, "X-Error-Message": header_text(exc.detail)}
    return exc


@contextmanager
def hub_errors(name: str) -> Iterator[None]:
    """Domain errors raised inside, re-raised with the headers the Hub's clients read."""
    try:
        yield
    except AppError as exc:
        hub = as_hub_error(exc, name)
        if hub is exc:
            raise
        raise hub from exc
