"""A real OpenID Provider for the SSO tests: panva's oidc-provider (npm, OpenID Certified) run
by node on 127.0.0.1 (tests/sso/idp.mjs), with one public client, users with groups, and a
plain login page; plus a helper that signs in through that page without a browser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from harness.serve_process import ROOT, free_port

IN_CI = os.environ.get("CI", "").lower() == "true"
CLIENT_ID = "tensor-registry-test"
PASSWORD = "correct horse battery staple"
USERS = {
    "alice": {"password": PASSWORD, "email": "alice@example.test", "groups": ["ml-publishers"]},
    "bob": {"password": PASSWORD, "email": "bob@example.test", "groups": ["readers"]},
    "carol": {"password": PASSWORD, "email": "carol@example.test", "groups": ["nobody"]},
}
# reader everywhere for "readers"; publisher in ml for "ml-publishers"; admin for "ops".
ROLES = [
    {"group": "readers", "role": "reader", "namespaces": ["*"]},
    {"group": "ml-publishers", "role": "publisher", "namespaces": ["ml"]},
    {"group": "ml-publishers", "role": "reader", "namespaces": ["shared"]},
    {"group": "ops", "role": "admin"},
]


@dataclass
class Idp:
    issuer: str
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)

    def set_groups(self, user: str, groups: list[str]) -> None:
        r = httpx.post(f"{self.issuer}/test/users/{user}", json={"groups": groups})
        assert r.status_code == 204

    def remove_user(self, user: str) -> None:
        assert httpx.delete(f"{self.issuer}/test/users/{user}").status_code == 204


def sso_settings(issuer: str, **extra: Any) -> dict[str, Any]:
    return {"issuer": issuer, "client_id": CLIENT_ID, "roles": ROLES, **extra}


@pytest.fixture(scope="session")
def idp_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def serve_port() -> int:
    """The port of the live registry the browser tests start (its callback is registered)."""
    return free_port()


@pytest.fixture(scope="session")
def idp(idp_port: int, serve_port: int) -> Iterator[Idp]:
    node = shutil.which("node")
    if node is None or not (ROOT / "node_modules" / "oidc-provider").is_dir():
        if IN_CI:
            pytest.fail("the SSO tests need node and `npm ci` (oidc-provider)")
        pytest.skip("node or node_modules/oidc-provider missing (npm ci)")
    config = {
        "port": idp_port,
        "client_id": CLIENT_ID,
        "redirect_uris": [
            "http://testserver/api/v1/sso/callback",
            f"http://127.0.0.1:{serve_port}/api/v1/sso/callback",
        ],
        "users": USERS,
    }
    process = subprocess.Popen(
        [node, str(ROOT / "tests" / "sso" / "idp.mjs"), json.dumps(config)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    idp = Idp(f"http://127.0.0.1:{idp_port}", process)
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            idp.log.append(line.rstrip())
            if line.startswith("READY "):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 90
    while not ready.wait(0.2):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the OpenID Provider did not start: {idp.log}")
    try:
        yield idp
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def sign_in_at_idp(authorize_url: str, user: str, *, stop_at: str, password: str = PASSWORD) -> str:
    """Through the provider's real login page (its form, its cookies) until it redirects to a
    URL starting with ``stop_at``; returns that URL."""
    with httpx.Client(timeout=30) as http:
        url, posted = authorize_url, False
        for _ in range(20):
            if url.startswith(stop_at):
                return url
            r = http.get(url)
            if r.status_code in (302, 303):
                url = str(r.url.join(r.headers["location"]))
                continue
            assert r.status_code == 200, (r.status_code, r.text[:500])
            assert "Example IdP sign-in" in r.text and not posted, r.text[:500]
            uid = urlsplit(str(r.url)).path.split("/")[2]
            r = http.post(
                f"{r.url.scheme}://{r.url.netloc.decode()}/interaction/{uid}/login",
                data={"username": user, "password": password},
            )
            posted = True
            assert r.status_code in (302, 303), (r.status_code, r.text[:300])
            url = str(r.url.join(r.headers["location"]))
    raise AssertionError(f"no redirect to {stop_at}")


def query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def fragment_query(url: str) -> dict[str, str]:
    fragment = urlsplit(url).fragment  # "/sso?code=..."
    return {k: v[0] for k, v in parse_qs(fragment.partition("?")[2]).items()}
