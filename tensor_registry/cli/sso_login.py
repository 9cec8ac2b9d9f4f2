"""`tensor-registry login --sso`: sign in with the organisation's identity provider.

As `gh auth login --web` and `gcloud auth login` do: a listener on a loopback port
(127.0.0.1, any free port: RFC 8252), the browser sent to the registry's sign-in (which goes on
to the identity provider), and back to the listener with a one-time code that only this process
can redeem (PKCE: the verifier never leaves it). The registry answers a session token bound to
the person, valid for the registry's session lifetime.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
import time
import webbrowser
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import UsageError
from tensor_registry.cli.output import say

_PAGE = (
    b"<!doctype html><title>tensor-registry</title><p>%s</p><p>You can close this tab and go "
    b"back to the terminal.</p>"
)


def _s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class _Listener(HTTPServer):
    answer: dict[str, str] | None = None


class _Handler(BaseHTTPRequestHandler):
    server: _Listener

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path != "/callback":
            self.send_error(404)
            return
        answer = {k: v[0] for k, v in parse_qs(parts.query).items()}
        if self.server.answer is None:
            self.server.answer = answer
        ok = "code" in answer
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(_PAGE % (b"Signed in." if ok else b"Sign-in failed."))

    def log_message(self, format: str, *args: Any) -> None:
        return


def sso_login(client: RegistryClient, *, open_browser: bool, timeout: float = 300.0) -> str:
    """Run the loopback sign-in; the session token."""
    verifier, state = secrets.token_urlsafe(48), secrets.token_urlsafe(16)
    listener = _Listener(("127.0.0.1", 0), _Handler)
    port = listener.server_address[1]
    query = urlencode({
        "client": "cli", "code_challenge": _s256(verifier), "state": state,
        "redirect_uri": f"http://127.0.0.1:{port}/callback",
    })  # fmt: skip
    address = f"{client.url}/api/v1/sso/login?{query}"
    thread = threading.Thread(target=listener.serve_forever, kwargs={"poll_interval": 0.2})
    thread.daemon = True
    thread.start()
    try:
        say(f"sign in with your browser at:\n  {address}")
        if open_browser:
            webbrowser.open(address)
        deadline = time.monotonic() + timeout
        while listener.answer is None:
            if time.monotonic() > deadline:
                raise UsageError(f"no sign-in came back within {timeout:.0f} s")
            time.sleep(0.1)
    finally:
        listener.shutdown()
        listener.server_close()
    answer = listener.answer
    if not secrets.compare_digest(answer.get("state", ""), state):
        raise UsageError("the sign-in came back with another state; start again")
    if "code" not in answer:
        raise UsageError(f"sign-in failed: {answer.get('error', 'no code')}")
    session = client.json(
        "POST", "/api/v1/sso/token", json={"code": answer["code"], "code_verifier": verifier}
    )
    return str(session["token"])
