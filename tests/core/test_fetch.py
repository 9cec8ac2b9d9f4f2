"""The guarded fetcher's rules, one by one, and its caps against a loopback helper server."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import pytest

from tensor_registry_server.core.addresses import AllowList, is_refused_address, parse_host
from tensor_registry_server.core.fetch import (
    FetchError,
    FetchPolicy,
    SourceRefused,
    check_literal,
    check_target,
    fetch_async,
    fetch_sync,
)
from tests.remote import RemoteServer, remote_server, without_urls

REFUSED_HOSTS = [
    "127.0.0.1",
    "127.1",
    "0x7f000001",
    "2130706433",
    "0x7f.0.0.1",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::7f00:1]",  # IPv4-compatible
    "[::ffff:0:7f00:1]",  # SIIT translated
    "[2002:7f00:1::]",  # 6to4 of 127.0.0.1
    "[2002:a9fe:a9fe::1]",  # 6to4 of 169.254.169.254
    "[64:ff9b::7f00:1]",  # NAT64 of 127.0.0.1
    "[64:ff9b::a9fe:a9fe]",
    "[64:ff9b:1::1]",
    "[2001::1]",  # Teredo
    "169.254.169.254",
    "[fe80::1]",
    "[fe80::1%25eth0]",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "[fd00::1]",
    "100.64.0.1",
    "[::]",
    "0.0.0.0",
    "0",
    "224.0.0.1",
    "[ff02::1]",
    "255.255.255.255",
    "240.0.0.1",
    "198.18.0.1",
]


@pytest.mark.parametrize("host", REFUSED_HOSTS)
def test_internal_addresses_in_every_spelling_are_refused(host: str) -> None:
    address = parse_host(host)
    assert address is not None and is_refused_address(address), host
    with pytest.raises(SourceRefused) as caught:
        check_literal(f"http://{host}:8080/manifest.json", AllowList())
    assert caught.value.code == "source_refused"
    with pytest.raises(SourceRefused):
        check_target(f"https://{host}/model.tensors", FetchPolicy(resolver=_no_dns))


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("0x7f000001", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("10.0x10.1", "10.16.0.1"),
        ("[::ffff:7f00:1]", "::ffff:7f00:1"),
    ],
)
def test_numeric_hosts_are_read_like_the_c_resolver_reads_them(host: str, expected: str) -> None:
    assert parse_host(host) == ipaddress.ip_address(expected)


@pytest.mark.parametrize(
    "host", ["1.2.3.4.5", "256.0.0.1", "1.0x100.0.0", "09.1.1.1", "4294967296"]
)
def test_malformed_numeric_hosts_are_refused(host: str) -> None:
    with pytest.raises(ValueError):
        parse_host(host)
    with pytest.raises(SourceRefused):
        check_literal(f"http://{host}/x", AllowList())


@pytest.mark.parametrize(
    "host", ["8.8.8.8", "[2606:4700:4700::1111]", "[2002:808:808::]", "[64:ff9b::808:808]"]
)
def test_public_addresses_pass(host: str) -> None:
    address = parse_host(host)
    assert address is not None and not is_refused_address(address)
    check_literal(f"https://{host}/m.json", AllowList())


def test_localhost_names_are_refused_without_dns() -> None:
    for url in ("http://localhost:9/x", "http://LOCALHOST./x", "http://api.localhost/x"):
        with pytest.raises(SourceRefused):
            check_literal(url, AllowList())
        with pytest.raises(SourceRefused):
            check_target(url, FetchPolicy(resolver=_no_dns))


def test_a_name_is_refused_when_any_answer_is_internal() -> None:
    policy = FetchPolicy(resolver=lambda host, port: ["8.8.8.8", "10.0.0.7"])
    with pytest.raises(SourceRefused) as caught:
        check_target("https://models.example/m.json", policy)
    assert "10.0.0.7" not in caught.value.detail  # what answered is not told


def test_the_allow_list_opts_hosts_and_networks_back_in() -> None:
    allow = AllowList.parse(["127.0.0.1", "10.0.0.0/8", "Models.Internal"])
    check_literal("http://127.0.0.1:9/x", allow)
    check_literal("http://[::ffff:127.0.0.1]:9/x", allow)  # the embedded address is allowed
    check_literal("http://10.2.3.4/x", allow)
    check_literal("http://models.internal/x", allow)
    with pytest.raises(SourceRefused):
        check_literal("http://127.0.0.2/x", allow)
    target = check_target(
        "http://models.internal:81/x",
        FetchPolicy(allow=allow, resolver=lambda host, port: ["192.168.7.7"]),
    )
    assert target.addresses == (ipaddress.ip_address("192.168.7.7"),)


def test_only_http_and_https_are_fetched() -> None:
    for url in ("file:///etc/passwd", "gopher://127.0.0.1/", "ftp://example.com/x", "http:///x"):
        with pytest.raises(SourceRefused):
            check_target(url, FetchPolicy(resolver=_no_dns))


def _no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"no DNS lookup expected for {host}")


def _policy(remote: RemoteServer, **overrides: object) -> FetchPolicy:
    """Allows exactly the helper server's name 'remote.test', which the resolver maps to
    127.0.0.1; every literal loopback URL stays refused."""
    values: dict[str, object] = {
        "allow": AllowList.parse(["remote.test"]),
        "resolver": lambda host, port: (
            ["127.0.0.1"] if host == "remote.test" else _no_dns(host, port)
        ),
        **overrides,
    }
    return FetchPolicy(**values)  # type: ignore[arg-type]


async def _read_async(url: str, policy: FetchPolicy, **kw: object) -> bytes:
    out = bytearray()
    async for chunk in fetch_async(url, policy, **kw):  # type: ignore[arg-type]
        out += chunk
    return bytes(out)


def _read_sync(url: str, policy: FetchPolicy, **kw: object) -> bytes:
    return b"".join(fetch_sync(url, policy, **kw))  # type: ignore[arg-type]


@pytest.fixture
def remote() -> object:
    with remote_server() as server:
        yield server


@pytest.mark.parametrize("variant", ["async", "sync"])
async def test_redirects_are_rechecked_at_every_hop(remote: RemoteServer, variant: str) -> None:
    remote.add("/m.json", b'{"files": []}')
    remote.redirect("/moved", remote.url("/m.json", host="remote.test"))
    remote.redirect("/evil", remote.url("/m.json"))  # the literal loopback address
    remote.redirect("/meta", "http://169.254.169.254/latest/meta-data/")
    policy = _policy(remote)

    async def read(url: str) -> bytes:
        if variant == "async":
            return await _read_async(url, policy)
        return await asyncio.to_thread(_read_sync, url, policy)

    assert await read(remote.url("/moved", host="remote.test")) == b'{"files": []}'
    assert [p for p, _ in remote.requests] == ["/moved", "/m.json"]
    # The pinned connection still says which host it asked for.
    assert {h for _, h in remote.requests} == {f"remote.test:{remote.port}"}
    remote.requests.clear()
    for path in ("/evil", "/meta"):
        with pytest.raises(SourceRefused):
            await read(remote.url(path, host="remote.test"))
    assert [p for p, _ in remote.requests] == ["/evil", "/meta"]  # the targets never


async def test_a_rebinding_name_is_resolved_once_and_the_checked_address_is_used(
    remote: RemoteServer,
) -> None:
    remote.add("/w.bin", b"weights")
    answers: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        # First answer: the allow-listed address; every later one: a refused one.
        answer = "127.0.0.1" if not answers else "::1"
        answers.append(answer)
        return [answer]

    policy = FetchPolicy(allow=AllowList.parse(["127.0.0.1/32"]), resolver=rebinding)
    url = f"http://rebind.test:{remote.port}/w.bin"
    assert await _read_async(url, policy) == b"weights"
    assert answers == ["127.0.0.1"]
    assert remote.requests == [("/w.bin", f"rebind.test:{remote.port}")]


@pytest.mark.parametrize("variant", ["async", "sync"])
async def test_byte_cap_and_deadline_end_endless_sources(
    remote: RemoteServer, variant: str
) -> None:
    remote.stream("/forever", b"x" * 65536)
    remote.stream("/trickle", b"x", every=0.05)

    async def read(url: str, policy: FetchPolicy) -> bytes:
        if variant == "async":
            return await _read_async(url, policy)
        return await asyncio.to_thread(_read_sync, url, policy)

    with pytest.raises(FetchError) as caught:
        await asyncio.wait_for(
            read(remote.url("/forever", host="remote.test"), _policy(remote, max_bytes=1 << 20)),
            30,
        )
    assert caught.value.code == "source_too_large" and caught.value.status == 422
    started = time.monotonic()
    with pytest.raises(FetchError) as caught:
        await asyncio.wait_for(
            read(remote.url("/trickle", host="remote.test"), _policy(remote, total_seconds=1.0)),
            30,
        )
    assert caught.value.code == "source_timeout" and caught.value.status == 422
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("expect", "body"), [("json", b"<html>" * 100), ("tensorizer", b"PK\x03\x04")]
)
async def test_the_first_bytes_must_look_like_what_the_caller_expects(
    remote: RemoteServer, expect: str, body: bytes
) -> None:
    remote.stream("/wrong", body)
    with pytest.raises(FetchError) as caught:
        await asyncio.wait_for(
            _read_async(remote.url("/wrong", host="remote.test"), _policy(remote), expect=expect),
            30,
        )
    assert caught.value.code == "source_unexpected_content"
    remote.add("/ok.json", b'\xef\xbb\xbf  \n{"files": []}')
    remote.add("/padded.tensors", b" |TZR|\x03\x00\x00\x00rest")
    remote.add("/ok.tensors", b"|TZR|\x03\x00\x00\x00rest")
    if expect == "tensorizer":
        with pytest.raises(FetchError):
            await _read_async(
                remote.url("/padded.tensors", host="remote.test"), _policy(remote), expect=expect
            )
    path = "/ok.json" if expect == "json" else "/ok.tensors"
    assert await _read_async(remote.url(path, host="remote.test"), _policy(remote), expect=expect)


async def test_errors_never_tell_what_answered(remote: RemoteServer) -> None:
    remote.add("/secret", b"internal admin page", status=401)
    closed = _closed_port()
    details = []
    for url in (
        remote.url("/secret", host="remote.test"),
        f"http://remote.test:{closed}/secret",
    ):
        with pytest.raises(FetchError) as caught:
            await _read_async(url, _policy(remote))
        assert caught.value.code == "source_unreachable"
        details.append(caught.value.detail.replace(str(closed), str(remote.port)))
    # An answering service and a closed port look the same.
    assert details[0] == details[1]
    for leak in ("401", "Unauthorized", "admin", "ConnectError", "Refused", "refused"):
        assert leak not in without_urls(details[0])


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Server modules that speak HTTP only to a process they started themselves on 127.0.0.1, never
# to a URL anyone names, and why.
LOCAL_ONLY = {
    "tensor_registry_server/artifacts/making/warm_steps.py": "the warm job's own vLLM on "
    "127.0.0.1 (health and one completion), started by the job and stopped after it",
}


def test_only_the_fetcher_opens_outbound_http_connections() -> None:
    """Server code (tensor_registry_server/ but the light client, and
    tensor_registry_server/jobs/worker/) imports an HTTP client library
    only in tensor_registry_server/core/fetch.py, so every URL the registry reads passes its
    rules."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    clients = {"httpx", "httpcore", "aiohttp", "requests", "urllib3", "urllib.request"}
    offenders = []
    for path in root.joinpath("tensor_registry_server").rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("tensor_registry/") or rel == "tensor_registry_server/core/fetch.py":
            continue
        if rel in LOCAL_ONLY:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{rel}: {n}"
                for n in names
                if n in clients or n.split(".")[0] in clients - {"urllib.request"}
            ]
    assert offenders == []
