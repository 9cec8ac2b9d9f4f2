"""One TLS context per process for the node's HTTP clients.

httpx builds a fresh ``ssl.SSLContext`` for every ``httpx.Client`` (reading the whole CA bundle):
20-60 ms on a GPU host and up to 0.6 s on a loaded 2-core VM, and every ``RegistryClient`` made
two, so the public ``load_artifact("ns/name:prod")`` (which makes its own client) paid it twice
per load (issue 35 §0). The context is built once, exactly as httpx builds its default (certifi,
or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` from the environment), and shared: an ``SSLContext`` is
safe to use from several clients and threads.
"""

from __future__ import annotations

import os
import ssl
import threading

import httpx

_contexts: dict[tuple[str | None, str | None], ssl.SSLContext] = {}
_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context for the current environment, made once."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _lock:
        context = _contexts.get(key)
        if context is None:
            context = _contexts[key] = httpx.create_ssl_context()
        return context
