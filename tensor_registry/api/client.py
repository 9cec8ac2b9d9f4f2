"""RegistryClient: the registry's HTTP API for serving nodes and the CLI (httpx, synchronous).

Every problem+json answer becomes a typed exception chosen by its ``code`` (then by status), so
callers can ``except NoMatchingArtifact`` or ``except SignatureExpired`` and the CLI can print one
clear line. Nothing here imports the server's packages.

The registry URL and token default to ``TENSOR_REGISTRY_URL`` / ``TENSOR_REGISTRY_TOKEN``. This
client is the one place outside tensor_registry_server.settings that reads the environment: it runs
on serving
nodes where the server's settings machinery (pydantic-settings) is not installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tensor_registry.api.errors import (  # noqa: F401 - re-exported: callers import errors from here
    AliasNotFound,
    ArtifactGone,
    ArtifactNotFound,
    AuthenticationError,
    ChecksumMismatch,
    Conflict,
    ConnectionFailed,
    InsufficientScope,
    InvalidKey,
    InvalidRequest,
    JobNotFound,
    KeyAccessRequired,
    ModelNotFound,
    NamespaceForbidden,
    NoMatchingArtifact,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    RegistryError,
    ResponseTooLarge,
    ServerError,
    ServiceUnavailable,
    SignatureExpired,
    SignatureInvalid,
    TransferTimeout,
    VersionNotFound,
    WrongKey,
    error_from_response,
)
from tensor_registry.api.resolution import Resolution, ResolvedFile
from tensor_registry.api.tls import tls_context
from tensor_registry.api.transfer import (
    DEFAULT_LIMITS,
    MAX_JSON_BYTES,
    TransferLimits,
    read_capped,
)
from tensor_registry.version import __version__

DEFAULT_URL = "http://127.0.0.1:8000"
KEY_BYTES = 32
USER_AGENT = f"tensor-registry-client/{__version__}"
# One event of a job's SSE stream (a job's JSON) stays far below this.
MAX_EVENT_BYTES = 1 << 20


def normalize_url(url: str) -> str:
    """'host:port' (as people type it) -> 'http://host:port'; no trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/")


def env_url() -> str:
    return os.environ.get("TENSOR_REGISTRY_URL") or DEFAULT_URL


def env_token() -> str | None:
    return os.environ.get("TENSOR_REGISTRY_TOKEN") or None


def _bounded_lines(response: httpx.Response, limit: int) -> Iterator[str]:
    """The lines of a streamed body (an SSE stream), refusing one longer than ``limit``
    bytes while it arrives (httpx's iter_lines would hold an endless line in memory)."""
    pending = bytearray()
    for chunk in response.iter_bytes():
        pending += chunk
        while (cut := pending.find(b"\n")) >= 0:
            line = bytes(pending[:cut]).rstrip(b"\r")
            del pending[: cut + 1]
            yield line.decode("utf-8", "replace")
        if len(pending) > limit:
            raise ResponseTooLarge(f"a line of the stream went past {limit:,} bytes", status=None)
    if pending:
        yield bytes(pending).rstrip(b"\r").decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# The client


@dataclass(frozen=True)
class SseMessage:
    event: str
    data: str
    id: str | None


def sse_messages(
    response: httpx.Response, stop: Callable[[], bool] | None = None, *, keep_empty: bool = False
) -> Iterator[SseMessage]:
    """The messages of a server-sent-events body; ``stop`` is asked on every line (keep-alive
    comments included) and ends the stream with ``KeyboardInterrupt``. With ``keep_empty`` a
    message that carries only an ``id:`` comes too (data empty)."""
    event, data, event_id = "message", list[str](), None
    # Lines and messages are bounded while they arrive (an endless line or message from a
    # lying server ends the stream instead of the node's memory).
    for line in _bounded_lines(response, MAX_EVENT_BYTES):
        if stop is not None and stop():
            raise KeyboardInterrupt
        if line == "":
            if data or (keep_empty and event_id is not None):
                yield SseMessage(event, "\n".join(data), event_id)
            event, data, event_id = "message", list[str](), None
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
            if sum(len(d) for d in data) > MAX_EVENT_BYTES:
                raise ResponseTooLarge(f"an event went past {MAX_EVENT_BYTES:,} bytes", status=None)
        elif line.startswith("id:"):
            event_id = line[3:].strip()


class RegistryClient:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        limits: TransferLimits = DEFAULT_LIMITS,
    ) -> None:
        self.url = normalize_url(url or env_url())
        # Bytes, idle time and deadlines of every transfer (tensor_registry/api/transfer.py).
        self.limits = limits
        self.token = token if token is not None else env_token()
        headers = {"User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self.http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
            transport=transport,
            follow_redirects=False,
            verify=tls_context(),
        )
        # Signed URLs carry their own auth: they must never receive the bearer token.
        self.anonymous = httpx.Client(
            headers={"User-Agent": USER_AGENT},
            timeout=httpx.Timeout(timeout, connect=10.0),
            transport=transport,
            follow_redirects=False,
            verify=tls_context(),
        )

    def close(self) -> None:
        self.http.close()
        self.anonymous.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One API call; its answer is read while streaming and refused past MAX_JSON_BYTES."""
        kwargs.setdefault("timeout", self.http.timeout)
        try:
            return read_capped(
                self.http,
                method,
                path,
                cap=MAX_JSON_BYTES,
                what=f"the registry at {self.url}",
                limits=self.limits,
                **kwargs,
            )
        except ConnectionFailed as exc:
            if type(exc) is ConnectionFailed:
                # The transport's own words once: exc.detail already names the registry's URL.
                cause = exc.__cause__ or exc.detail
                raise ConnectionFailed(f"cannot reach the registry at {self.url}: {cause}") from exc
            raise

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def paged(
        self, path: str, params: dict[str, Any] | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a list route (following ``next_cursor``), or the first ``limit``."""
        items: list[dict[str, Any]] = []
        query = {k: v for k, v in (params or {}).items() if v is not None}
        while True:
            query["limit"] = 500 if limit is None else min(500, limit - len(items))
            page = self.json("GET", path, params=query)
            items += page["items"]
            cursor = page.get("next_cursor")
            if not cursor or (limit is not None and len(items) >= limit):
                return items
            query["cursor"] = cursor

    # -- models, versions, aliases ---------------------------------------------------------------

    def find_model(self, name: str) -> dict[str, Any] | None:
        items = self.json("GET", "/api/v1/models", params={"name": name})["items"]
        return dict(items[0]) if items else None

    def get_model(self, name: str) -> dict[str, Any]:
        model = self.find_model(name)
        if model is None:
            raise ModelNotFound(f"No model named '{name}'.", status=404)
        return model

    def create_model(
        self, name: str, *, description: str = "", tags: list[str] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "description": description}
        if tags:
            body["tags"] = tags
        return dict(self.json("POST", "/api/v1/models", json=body))

    def list_models(
        self, *, q: str | None = None, tag: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        return self.paged("/api/v1/models", {"q": q, "tag": tag}, limit=limit)

    def update_model(self, model_id: str, changes: dict[str, Any], *, etag: str) -> dict[str, Any]:
        return dict(
            self.json(
                "PATCH", f"/api/v1/models/{model_id}", json=changes, headers={"If-Match": etag}
            )
        )

    def delete_model(self, model_id: str) -> None:
        self.request("DELETE", f"/api/v1/models/{model_id}")

    def list_versions(self, model_id: str) -> list[dict[str, Any]]:
        return self.paged(f"/api/v1/models/{model_id}/versions")

    def get_version(self, model_id: str, number: int) -> dict[str, Any]:
        return dict(self.json("GET", f"/api/v1/models/{model_id}/versions/{number}"))

    def delete_version(self, model_id: str, number: int) -> None:
        self.request("DELETE", f"/api/v1/models/{model_id}/versions/{number}")

    def list_aliases(self, model_id: str) -> list[dict[str, Any]]:
        return list(self.json("GET", f"/api/v1/models/{model_id}/aliases")["items"])

    def get_alias(self, model_id: str, alias: str) -> dict[str, Any] | None:
        """The alias (with its ``etag``), or None when it does not exist."""
        try:
            return dict(self.json("GET", f"/api/v1/models/{model_id}/aliases/{quote(alias)}"))
        except AliasNotFound:
            return None

    def set_alias(
        self, model_id: str, alias: str, version: int, *, etag: str | None
    ) -> dict[str, Any]:
        headers = {"If-Match": etag} if etag else {}
        return dict(
            self.json(
                "PUT",
                f"/api/v1/models/{model_id}/aliases/{quote(alias)}",
                json={"version": version},
                headers=headers,
            )
        )

    def rollout(self, model_id: str, alias: str) -> dict[str, Any]:
        """Which watching nodes are warm on the alias's target (GET …/aliases/{alias}/rollout)."""
        return dict(self.json("GET", f"/api/v1/models/{model_id}/aliases/{quote(alias)}/rollout"))

    def delete_alias(self, model_id: str, alias: str) -> None:
        self.request("DELETE", f"/api/v1/models/{model_id}/aliases/{quote(alias)}")

    def list_artifacts(
        self, model_id: str, *, version: int | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        return self.paged(
            f"/api/v1/models/{model_id}/artifacts", {"version": version, "status": status}
        )

    def delete_artifact(self, artifact_id: str) -> None:
        self.request("DELETE", f"/api/v1/artifacts/{artifact_id}")

    def list_jobs(self, *, limit: int | None = None, **filters: Any) -> list[dict[str, Any]]:
        return self.paged("/api/v1/jobs", filters, limit=limit)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return dict(self.json("POST", f"/api/v1/jobs/{job_id}/cancel"))

    def create_token(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.json("POST", "/api/v1/tokens", json=body))

    def list_tokens(self) -> list[dict[str, Any]]:
        return self.paged("/api/v1/tokens")

    def revoke_token(self, token_id: str) -> None:
        self.request("DELETE", f"/api/v1/tokens/{token_id}")

    def token_self(self) -> dict[str, Any]:
        return dict(self.json("GET", "/api/v1/tokens/self"))

    def create_version(self, model_id: str) -> dict[str, Any]:
        return dict(self.json("POST", f"/api/v1/models/{model_id}/versions", json={}))

    def upload_file(
        self,
        model_id: str,
        number: int,
        path: str,
        chunks: Iterable[bytes],
        *,
        size: int,
        sha256: str,
    ) -> dict[str, Any]:
        return dict(
            self.json(
                "PUT",
                f"/api/v1/models/{model_id}/versions/{number}/files/{quote(path)}",
                content=chunks,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(size),
                    "X-Content-SHA256": sha256,
                },
                timeout=httpx.Timeout(None, connect=10.0),
            )
        )

    def delete_file(self, model_id: str, number: int, path: str) -> None:
        self.request("DELETE", f"/api/v1/models/{model_id}/versions/{number}/files/{quote(path)}")

    def finalize(self, model_id: str, number: int) -> dict[str, Any]:
        return dict(self.json("POST", f"/api/v1/models/{model_id}/versions/{number}/finalize"))

    def version_for_ref(self, model_id: str, ref: str) -> int | None:
        """The version number a ref names now (None for 'latest': the server decides)."""
        if ref == "latest":
            return None
        if ref.isdigit():
            return int(ref)
        alias = self.json("GET", f"/api/v1/models/{model_id}/aliases/{quote(ref)}")
        return int(alias["version"])

    def version_number(self, model_id: str, ref: str) -> int:
        """What ':REF' names now: N, an alias, or 'latest' (the highest ready version)."""
        number = self.version_for_ref(model_id, ref)
        if number is not None:
            return number
        ready = [v["version"] for v in self.list_versions(model_id) if v["status"] == "ready"]
        if not ready:
            raise VersionNotFound("This model has no ready version yet.", status=404)
        return int(max(ready))

    # -- tensorize and jobs --------------------------------------------------------------------

    def tensorize(self, model_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(202, job) when work was queued, (200, artifact) when it was already ready."""
        response = self.request("POST", f"/api/v1/models/{model_id}/tensorize", json=body)
        return response.status_code, dict(response.json())

    def get_job(self, job_id: str) -> dict[str, Any]:
        return dict(self.json("GET", f"/api/v1/jobs/{job_id}"))

    def get_artifact(self, artifact_id: str) -> dict[str, Any]:
        return dict(self.json("GET", f"/api/v1/artifacts/{artifact_id}"))

    def job_events(
        self, job_id: str, stop: Callable[[], bool] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Job states from the SSE stream (``event: job``) until it closes. ``stop`` is asked on
        every line, keep-alive comments included (the server sends one at least every 15 s):
        when it says so the stream ends with ``KeyboardInterrupt``."""
        try:
            with self.http.stream(
                "GET",
                f"/api/v1/jobs/{job_id}/events",
                headers={"Accept": "text/event-stream"},
                timeout=httpx.Timeout(None, connect=10.0),
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise error_from_response(response)
                for message in sse_messages(response, stop):
                    if message.event in ("job", "message"):
                        yield json.loads(message.data)
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"job event stream interrupted: {exc}") from exc

    def events(
        self,
        *,
        last_event_id: str | None = None,
        types: Sequence[str] = (),
        idle_timeout: float = 60.0,
    ) -> Iterator[dict[str, Any]]:
        """The registry's events (``GET /api/v1/events``) after ``last_event_id`` (every one
        the token may see, then each new one), as their JSON envelopes; blocks between them.
        The stream's starting point comes first as ``{"id": …}`` alone (without a cursor the
        server starts at its newest event). The server sends a keep-alive at least every 15 s:
        ``idle_timeout`` without a byte means the connection is dead (ConnectionFailed)."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        params = {"types": ",".join(types)} if types else None
        try:
            with self.http.stream(
                "GET",
                "/api/v1/events",
                headers=headers,
                params=params,
                timeout=httpx.Timeout(10.0, read=idle_timeout),
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise error_from_response(response)
                for message in sse_messages(response, keep_empty=True):
                    if message.data:
                        yield dict(json.loads(message.data))
                    elif message.id is not None:
                        yield {"id": message.id}
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"event stream interrupted: {exc}") from exc

    def wait_job(
        self,
        job_id: str,
        *,
        on_update: Callable[[dict[str, Any]], None] | None = None,
        poll_seconds: float = 1.0,
        stop: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """Follow the job live (SSE), falling back to polling, until a final status; ``stop``
        (see ``job_events``) ends it with ``KeyboardInterrupt``."""
        final = {"succeeded", "failed", "cancelled"}
        job: dict[str, Any] | None = None
        try:
            for job in self.job_events(job_id, stop):
                if on_update:
                    on_update(job)
                if job.get("status") in final:
                    return job
        except (ConnectionFailed, NotFound, InvalidRequest, ValueError):
            pass  # no stream (older server, proxy): poll instead
        while True:
            if stop is not None and stop():
                raise KeyboardInterrupt
            job = self.get_job(job_id)
            if on_update:
                on_update(job)
            if job.get("status") in final:
                return job
            time.sleep(poll_seconds)

    # -- resolve and keys ------------------------------------------------------------------------

    def resolve(self, model: str, ref: str = "latest", **filters: Any) -> Resolution:
        params: dict[str, Any] = {"model": model, "ref": ref}
        for name, value in filters.items():
            if value is None:
                continue
            params[name] = ("true" if value else "false") if isinstance(value, bool) else value
        answer = Resolution(dict(self.json("GET", "/api/v1/resolve", params=params)), params)
        # Every path passes the shared rule before anything is fetched or written (issue 26 §1).
        answer.check_files()
        return answer

    def resolve_again(self, resolution: Resolution) -> Resolution:
        """The same request again (by its ref): for a caller that has used nothing of the
        first answer yet. Once bytes were taken from an answer, ``reresolve`` instead."""
        params = dict(resolution.params)
        model, ref = params.pop("model"), params.pop("ref")
        return self.resolve(model, ref, **params)

    def reresolve(self, resolution: Resolution) -> Resolution:
        """Fresh signed URLs for the artifact ``resolution`` named, never another one: the
        ref becomes its version number and the artifact id is pinned (``artifact_id``), so a
        download that outlives its URLs while an alias moves keeps its artifact. Raises
        ``ArtifactGone`` when the registry no longer serves it."""
        params = dict(resolution.params)
        model = params.pop("model")
        params.pop("ref", None)
        params["artifact_id"] = resolution.artifact_id
        try:
            return self.resolve(model, str(resolution.version), **params)
        except NotFound as exc:
            raise ArtifactGone(
                f"artifact {resolution.artifact_id} (version {resolution.version} of {model}), "
                "which this download started with, is no longer served "
                f"({exc.code}: {exc.detail}); nothing of another artifact was mixed in: "
                "start again to get what the ref names now",
                status=exc.status,
            ) from exc

    @staticmethod
    def read_key_file(path: Path) -> bytes:
        """A node's own key file for an encrypted artifact (``--keyfile``): the raw 32 bytes
        tensorizer's key files hold. The registry is not asked for the key then."""
        try:
            with open(path, "rb") as fh:
                key = fh.read(KEY_BYTES + 1)
        except OSError as exc:
            raise InvalidKey(
                f"cannot read the key file {path}: {exc.strerror}", status=None
            ) from exc
        if len(key) != KEY_BYTES:
            raise InvalidKey(
                f"the key file {path} holds {len(key)}{'+' if len(key) > KEY_BYTES else ''} "
                f"bytes, not the {KEY_BYTES} of a tensorizer key",
                status=None,
            )
        return key

    def fetch_key(self, url: str) -> bytes:
        """The artifact key (exactly KEY_BYTES): reading stops past that many bytes."""
        try:
            response = read_capped(
                self.anonymous, "GET", url, cap=KEY_BYTES, what="the key", limits=self.limits
            )
        except ResponseTooLarge as exc:
            raise InvalidKey(
                f"the key URL returned more than {KEY_BYTES} bytes", status=exc.status
            ) from exc
        if len(response.content) != KEY_BYTES:
            raise InvalidKey(
                f"the key URL returned {len(response.content)} bytes, not {KEY_BYTES}",
                status=response.status_code,
            )
        return response.content

    def fetch_resolved_file(self, entry: ResolvedFile, what: str) -> bytes:
        """A small file of a resolve answer (the layout manifest, the signed manifest) through
        its signed URL, checked against the answer's sha256. The caller bounds ``entry.size``
        first. Signed URLs carry their own auth: the bearer token never goes to a blob URL.
        Reading stops past ``entry.size`` bytes; fewer fail the sha256."""
        response = read_capped(
            self.anonymous,
            "GET",
            entry.url,
            cap=entry.size,
            what=what,
            limits=self.limits,
            headers={"Accept-Encoding": "identity"},
        )
        if hashlib.sha256(response.content).hexdigest() != entry.sha256:
            raise ChecksumMismatch(f"the {what}'s bytes do not match its sha256", status=None)
        return response.content

    def probe(self, url: str) -> None:
        """Raise the registry's error for a signed URL (expired, altered, gone), if any."""
        # Only the status matters: a server that ignores the range is not read past one byte.
        with contextlib.suppress(ResponseTooLarge):
            read_capped(
                self.anonymous,
                "GET",
                url,
                cap=1,
                what=f"the probe of {url.split('?')[0]}",
                limits=self.limits,
                headers={"Range": "bytes=0-0", "Accept-Encoding": "identity"},
            )
