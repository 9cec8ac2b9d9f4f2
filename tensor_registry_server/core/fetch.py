"""The one guarded outbound fetcher: every URL the registry reads goes through here.

Rules (docs/security.md says the same for operators; which addresses are refused lives in
tensor_registry_server/core/addresses.py):

- Only ``http``/``https``. The host is parsed once (httpx's parser, the one that connects) and
  resolved once; *every* resolved address must pass, and the connection goes to a checked
  address (the URL is rewritten to the IP; ``Host`` and TLS SNI/certificate checks keep the
  name), so a second DNS answer can never redirect the connection (DNS rebinding).
- Refused unless the operator allow-lists them (``TENSOR_REGISTRY_FETCH__ALLOW``: host names and
  IPs/CIDRs): loopback, private (RFC 1918, fc00::/7), link-local (169.254/16, fe80::/10), CGNAT
  (100.64/10), multicast, unspecified, reserved/broadcast, documentation and benchmarking ranges,
  and IPv6 forms that embed an IPv4 address (mapped ``::ffff:a.b.c.d``, compatible ``::a.b.c.d``,
  SIIT ``::ffff:0:a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``), whose embedded
  address is decoded and checked too; Teredo and local NAT64 (``64:ff9b:1::/48``) are refused.
  Numeric hosts are read the way browsers and the C resolver read them (``0x7f000001``,
  ``2130706433``, ``127.1``); forms httpx would not parse (``0177.0.0.1``) are refused.
- Redirects are followed up to ``max_redirects`` hops; every hop is checked like the first URL,
  and an https URL never redirects to plain http.
- One deadline for the whole fetch (resolve, connect, redirects, body), an idle-read timeout, and
  a byte cap; callers that know the format check its first bytes (``expect``).
- Errors say only *that* a source was refused, unreachable, too large, too slow or not what was
  expected: never a remote status code, body or exception name (the operator log has the
  status). ``FetchError.reason`` lets each caller build its own stable code.

``fetch_async`` (API, import job) and ``fetch_sync`` (worker threads) share every rule.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlencode, urlsplit

import httpx

from tensor_registry_server.core.addresses import (
    AllowList,
    IPAddress,
    is_local_name,
    is_refused_address,
    parse_host,
)
from tensor_registry_server.core.errors import AppError
from tensor_registry_server.core.redact import redact_uri

if TYPE_CHECKING:
    from tensor_registry_server.settings import Settings

log = logging.getLogger("tensor_registry.fetch")

# (host, port) -> addresses as strings, like getaddrinfo; tests inject their own.
Resolver = Callable[[str, int], Sequence[str]]
Expect = Literal["json", "tensorizer"]
TENSORIZER_MAGIC = b"|TZR|"
_REDIRECTS = {301, 302, 303, 307, 308}


class FetchError(AppError):
    """A source that could not be used; ``reason`` is one of refused, unreachable, too_large,
    timeout, unexpected_content (callers prefix it: ``source_refused``, ``import_source_…``)."""

    status, title = 422, "Source not usable"
    reason = "unreachable"

    def __init__(self, detail: str, **kw: object) -> None:
        kw.setdefault("code", f"source_{self.reason}")
        super().__init__(detail, **kw)  # type: ignore[arg-type]


class SourceRefused(FetchError):
    reason = "refused"


class SourceUnreachable(FetchError):
    reason = "unreachable"


class SourceTooLarge(FetchError):
    reason = "too_large"


class SourceTimeout(FetchError):
    reason = "timeout"


class SourceUnexpected(FetchError):
    reason = "unexpected_content"


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class FetchPolicy:
    allow: AllowList = field(default_factory=AllowList)
    max_bytes: int = 200 * 1024**3
    total_seconds: float = 4 * 3600.0
    connect_seconds: float = 10.0
    read_seconds: float = 60.0
    max_redirects: int = 5
    resolver: Resolver = system_resolver

    @classmethod
    def from_settings(cls, settings: Settings, *, resolver: Resolver | None = None) -> FetchPolicy:
        fetch = settings.fetch
        return cls(
            allow=AllowList.parse(fetch.allow),
            max_bytes=fetch.max_bytes,
            total_seconds=fetch.total_seconds,
            connect_seconds=fetch.connect_seconds,
            read_seconds=fetch.read_seconds,
            max_redirects=fetch.max_redirects,
            resolver=resolver or system_resolver,
        )


def _refused(url: str, why: str) -> SourceRefused:
    log.warning("outbound fetch of %s refused: %s", redact_uri(url), why)
    return SourceRefused(
        f"The source {redact_uri(url)} was refused: this registry does not fetch from that "
        "address (an operator can allow it with TENSOR_REGISTRY_FETCH__ALLOW)."
    )


def _unreachable(url: str, why: str) -> SourceUnreachable:
    log.warning("outbound fetch of %s failed: %s", redact_uri(url), why)
    return SourceUnreachable(f"The source {redact_uri(url)} could not be fetched.")


def parse_url(url: str | httpx.URL) -> httpx.URL:
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
        # `.host` decodes punycode lazily: a malformed A-label (`https://xn--/`) raises here,
        # not in whichever caller reads the host next (it was a 500).
        host = parsed.host
    except (httpx.InvalidURL, ValueError) as exc:  # idna.IDNAError is a ValueError
        raise _refused(str(url), f"unparseable URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not host:
        raise _refused(str(url), "not an http(s) URL with a host")
    return parsed


def check_literal(url: str, allow: AllowList) -> None:
    """Cheap request-time check (no DNS): a literal internal address or ``localhost``."""
    parsed = parse_url(url)
    if allow.allows_host(parsed.host):
        return
    try:
        address = parse_host(parsed.host)
    except ValueError as exc:
        raise _refused(url, str(exc)) from None
    if address is None:
        if is_local_name(parsed.host):
            raise _refused(url, "a localhost name")
        return
    if is_refused_address(address) and not allow.allows_address(address):
        raise _refused(url, f"literal address {address}")


@dataclass(frozen=True)
class Target:
    """A URL whose addresses were checked; requests go to ``addresses`` in order."""

    url: httpx.URL
    addresses: tuple[IPAddress, ...]

    def requests(
        self,
        method: str = "GET",
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Iterator[httpx.Request]:
        host_header = self.url.netloc.decode("ascii")
        for address in self.addresses:
            extensions = {}
            if self.url.scheme == "https" and parse_host(self.url.host) is None:
                extensions["sni_hostname"] = self.url.host
            yield httpx.Request(
                method,
                self.url.copy_with(host=str(address)),
                headers={**(headers or {}), "Host": host_header, "Accept-Encoding": "identity"},
                content=content,
                extensions=extensions,
            )


def check_target(url: str | httpx.URL, policy: FetchPolicy) -> Target:
    """Parse, resolve once and check every address (blocking: call in a thread from async)."""
    parsed = parse_url(url)
    host = parsed.host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    host_allowed = policy.allow.allows_host(host)
    try:
        literal = parse_host(host)
    except ValueError as exc:
        raise _refused(str(url), str(exc)) from None
    if literal is not None:
        answers: Sequence[str] = [str(literal)]
    else:
        if is_local_name(host) and not host_allowed:
            raise _refused(str(url), "a localhost name")
        try:
            answers = policy.resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise _unreachable(str(url), f"name resolution failed ({exc})") from None
    addresses: list[IPAddress] = []
    for answer in answers:
        try:
            address = ipaddress.ip_address(answer)
        except ValueError:
            raise _refused(str(url), f"resolver answered {answer!r}") from None
        refused = is_refused_address(address) and not policy.allow.allows_address(address)
        if refused and not host_allowed:
            raise _refused(str(url), f"{host} resolves to {address}")
        addresses.append(address)
    if not addresses:
        raise _unreachable(str(url), "no address")
    return Target(parsed, tuple(addresses))


class _Budget:
    """The deadline, the byte cap and the first-bytes check of one fetch."""

    def __init__(self, url: str, policy: FetchPolicy, max_bytes: int | None, expect: Expect | None):
        self.url = url
        self.deadline = time.monotonic() + policy.total_seconds
        self.max_bytes = policy.max_bytes if max_bytes is None else min(max_bytes, policy.max_bytes)
        self.expect = expect
        self.received = 0
        self._head = b""
        self._head_checked = expect is None

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.timeout()
        return left

    def timeout(self) -> SourceTimeout:
        log.warning("outbound fetch of %s hit its deadline", redact_uri(self.url))
        return SourceTimeout(
            f"The source {redact_uri(self.url)} took longer than the fetch deadline."
        )

    def timeouts(self, policy: FetchPolicy) -> httpx.Timeout:
        left = self.remaining()
        return httpx.Timeout(
            min(policy.read_seconds, left), connect=min(policy.connect_seconds, left)
        )

    def take(self, chunk: bytes) -> None:
        self.remaining()
        self.received += len(chunk)
        if self.received > self.max_bytes:
            log.warning("outbound fetch of %s passed %d bytes", redact_uri(self.url), self.received)
            raise SourceTooLarge(
                f"The source {redact_uri(self.url)} is larger than the limit of "
                f"{self.max_bytes} bytes."
            )
        if not self._head_checked:
            head = self._head + chunk
            if self.expect == "json":
                # JSON may open with a byte-order mark and whitespace before its first "{".
                head = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
            self._head = head[:64]
            self._check_head(final=False)

    def finish(self) -> None:
        if not self._head_checked:
            self._check_head(final=True)

    def _check_head(self, *, final: bool) -> None:
        head = self._head
        if self.expect == "tensorizer":
            if len(head) < len(TENSORIZER_MAGIC) and not final:
                return
            ok = head.startswith(TENSORIZER_MAGIC)
        else:
            if not head and not final:
                return
            ok = head[:1] == b"{"
        if not ok:
            raise SourceUnexpected(
                f"The source {redact_uri(self.url)} is not "
                f"{'a tensorizer file' if self.expect == 'tensorizer' else 'a JSON object'}."
            )
        self._head_checked = True


def _next_url(current: httpx.URL, response: httpx.Response, hops: int, policy: FetchPolicy) -> str:
    location = response.headers.get("location")
    if not location:
        raise _unreachable(str(current), f"HTTP {response.status_code} without Location")
    if hops >= policy.max_redirects:
        raise _unreachable(str(current), "too many redirects")
    try:
        target = current.join(location)
    except (httpx.InvalidURL, ValueError):
        raise _refused(str(current), "unparseable redirect") from None
    if current.scheme == "https" and target.scheme != "https":
        raise _refused(str(target), "redirect from https to another scheme")
    return str(target)


def _status_problem(url: httpx.URL, response: httpx.Response) -> SourceUnreachable:
    return _unreachable(str(url), f"HTTP {response.status_code}")


def _transport_problem(url: str, exc: Exception, budget: _Budget) -> FetchError:
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError):
        return _unreachable(url, type(exc).__name__)
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return budget.timeout()
    return _unreachable(url, f"{type(exc).__name__}: {exc}")


async def fetch_async(
    url: str,
    policy: FetchPolicy,
    *,
    max_bytes: int | None = None,
    expect: Expect | None = None,
) -> AsyncIterator[bytes]:
    """The body of ``url`` in chunks, every rule above applied."""
    budget = _Budget(url, policy, max_bytes, expect)
    current = url
    for hops in range(policy.max_redirects + 1):
        async with asyncio.timeout(budget.remaining()):
            target = await asyncio.to_thread(check_target, current, policy)
        async with httpx.AsyncClient(
            follow_redirects=False, trust_env=False, timeout=budget.timeouts(policy)
        ) as client:
            response = None
            error: Exception | None = None
            for request in target.requests():
                try:
                    async with asyncio.timeout(budget.remaining()):
                        response = await client.send(request, stream=True)
                    break
                except httpx.ConnectError as exc:
                    error = exc
                except (httpx.HTTPError, OSError, TimeoutError) as exc:
                    raise _transport_problem(current, exc, budget) from None
            if response is None:
                raise _transport_problem(current, error or OSError("no address"), budget)
            try:
                if response.status_code in _REDIRECTS:
                    current = _next_url(target.url, response, hops, policy)
                    continue
                if response.status_code != 200:
                    raise _status_problem(target.url, response)
                chunks = response.aiter_raw()
                while True:
                    try:
                        async with asyncio.timeout(budget.remaining()):
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    except (httpx.HTTPError, OSError, TimeoutError) as exc:
                        raise _transport_problem(current, exc, budget) from None
                    budget.take(chunk)
                    yield chunk
                budget.finish()
                return
            finally:
                await response.aclose()
    raise _unreachable(url, "too many redirects")


# What a POST reads of the answer (then drops): enough to finish a small reply cleanly.
_POST_ANSWER_BYTES = 64 * 1024


async def post_async(
    url: str, policy: FetchPolicy, *, content: bytes, headers: Mapping[str, str]
) -> int:
    """POST ``content`` to ``url`` under every rule above; returns the answer's status code.

    Redirects are not followed (the 3xx is the answer: a webhook receiver that moved must be
    updated, not chased), and the answer's body is read up to 64 KiB and dropped (nothing a
    receiver says is stored or shown)."""
    budget = _Budget(url, policy, None, None)
    async with asyncio.timeout(budget.remaining()):
        target = await asyncio.to_thread(check_target, url, policy)
    async with httpx.AsyncClient(
        follow_redirects=False, trust_env=False, timeout=budget.timeouts(policy)
    ) as client:
        error: Exception | None = None
        for request in target.requests("POST", content=content, headers=headers):
            try:
                async with asyncio.timeout(budget.remaining()):
                    response = await client.send(request, stream=True)
                    try:
                        read = 0
                        async for chunk in response.aiter_raw():
                            read += len(chunk)
                            if read >= _POST_ANSWER_BYTES:
                                break
                    finally:
                        await response.aclose()
                return response.status_code
            except httpx.ConnectError as exc:
                error = exc
            except (httpx.HTTPError, OSError, TimeoutError) as exc:
                raise _transport_problem(url, exc, budget) from None
        raise _transport_problem(url, error or OSError("no address"), budget)


def fetch_sync(
    url: str,
    policy: FetchPolicy,
    *,
    max_bytes: int | None = None,
    expect: Expect | None = None,
) -> Iterator[bytes]:
    """``fetch_async`` for threads. The deadline is checked between reads, and every read waits
    at most the time left (or ``read_seconds``), so it holds within one read."""
    budget = _Budget(url, policy, max_bytes, expect)
    current = url
    for hops in range(policy.max_redirects + 1):
        target = check_target(current, policy)
        with httpx.Client(
            follow_redirects=False, trust_env=False, timeout=budget.timeouts(policy)
        ) as client:
            response = None
            error: Exception | None = None
            for request in target.requests():
                try:
                    response = client.send(request, stream=True)
                    break
                except httpx.ConnectError as exc:
                    error = exc
                except (httpx.HTTPError, OSError) as exc:
                    raise _transport_problem(current, exc, budget) from None
            if response is None:
                raise _transport_problem(current, error or OSError("no address"), budget)
            try:
                if response.status_code in _REDIRECTS:
                    current = _next_url(target.url, response, hops, policy)
                    continue
                if response.status_code != 200:
                    raise _status_problem(target.url, response)
                try:
                    for chunk in response.iter_raw():
                        budget.take(chunk)
                        yield chunk
                except (httpx.HTTPError, OSError) as exc:
                    raise _transport_problem(current, exc, budget) from None
                budget.finish()
                return
            finally:
                response.close()
    raise _unreachable(url, "too many redirects")


# -- s3:// sources ---------------------------------------------------------------------------
def check_s3_source(uri: str, settings: Settings) -> None:
    """Only buckets/prefixes in ``fetch.s3_allow`` may be read; the registry's own bucket never
    (a namespace-limited writer must not copy other namespaces' objects)."""
    parts = urlsplit(uri)
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if bucket == settings.storage.s3.bucket:
        raise _refused(uri, "the registry's own bucket")
    for entry in settings.fetch.s3_allow:
        allowed_bucket, _, allowed_prefix = entry.removeprefix("s3://").partition("/")
        if allowed_bucket != bucket:
            continue
        if allowed_prefix and not allowed_prefix.endswith("/"):
            allowed_prefix += "/"
        if key.startswith(allowed_prefix) or (key + "/") == allowed_prefix:
            return
    log.warning("s3 source %s refused: not in fetch.s3_allow", redact_uri(uri))
    raise SourceRefused(
        f"The source {redact_uri(uri)} was refused: imports are allowed only from the buckets "
        "and prefixes in TENSOR_REGISTRY_FETCH__S3_ALLOW."
    )


async def post_form(
    url: str, form: Mapping[str, str], policy: FetchPolicy, *, max_bytes: int
) -> tuple[int, bytes]:
    """POST ``form`` (urlencoded) under the same address rules as every fetch, no redirects;
    the status and at most ``max_bytes`` of the body. FetchError when the target is refused
    or cannot be reached (an OpenID Provider's token endpoint: tensor_registry_server.core.oidc)."""
    target = await asyncio.to_thread(check_target, url, policy)
    timeout = httpx.Timeout(policy.read_seconds, connect=policy.connect_seconds)
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
    body = urlencode(dict(form)).encode()
    async with httpx.AsyncClient(
        follow_redirects=False, trust_env=False, timeout=timeout
    ) as client:
        for request in target.requests("POST", content=body, headers=headers):
            try:
                async with asyncio.timeout(policy.read_seconds + policy.connect_seconds):
                    response = await client.send(request, stream=True)
                    try:
                        received = bytearray()
                        async for chunk in response.aiter_raw():
                            received += chunk
                            if len(received) > max_bytes:
                                break
                    finally:
                        await response.aclose()
                return response.status_code, bytes(received)
            except httpx.ConnectError:
                continue
            except (httpx.HTTPError, OSError, TimeoutError):
                break
    raise SourceUnreachable(f"{redact_uri(str(url))} could not be reached")
