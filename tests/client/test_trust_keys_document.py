"""The keys document on the node (issue 26 §2): a key the registry marks retired in a document
signed by a key the node trusts stops being trusted for good (a replayed older document does not
bring it back); what a swapped (untrusted) key signs teaches nothing; a stale or unsigned
document is refused once pinned; a malformed one is a clear `bad_keys` error, not a traceback.

The registry is played by a loopback server that serves ManifestKeys documents, the server's
own builder, so the node meets exactly what `/.well-known/tensor-registry/keys` sends.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.loopback import QuietHandler, serving
from harness.serve_process import ROOT
from tensor_registry import RegistryClient
from tensor_registry.trust import (
    KEYS_DOCUMENT_MAX_AGE,
    PinStore,
    TrustError,
    trusted_keys,
)
from tensor_registry_server.trust.signing_keys import ManifestKeys

REGISTRY_ID = "tr-keys-document-test"


@contextmanager
def keys_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A registry that serves ``state["document"]`` at the keys route."""
    state: dict[str, Any] = {"document": {}}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            body = json.dumps(state["document"]).encode()
            self.send_response(200 if self.path == "/.well-known/tensor-registry/keys" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Handler) as url:
        yield url, state


def _doc(keys: ManifestKeys, issued_at: str = "") -> dict[str, Any]:
    from datetime import UTC, datetime

    return keys.document(issued_at or datetime.now(UTC).isoformat().replace("+00:00", "Z"))


def test_a_key_the_registry_retires_stops_being_trusted_for_good(tmp_path: Path) -> None:
    old, new, stranger = (Ed25519PrivateKey.generate() for _ in range(3))
    rotated = ManifestKeys(new, [old], [], REGISTRY_ID)
    old_id = ManifestKeys(old, [], [], REGISTRY_ID).active_id
    pins = PinStore(tmp_path)
    with keys_server() as (url, state), RegistryClient(url) as client:
        state["document"] = _doc(ManifestKeys(old, [], [], REGISTRY_ID))
        assert set(trusted_keys(client, pins=pins)) == {old_id}
        state["document"] = _doc(rotated)  # the new key, endorsed by the pinned old one
        assert set(trusted_keys(client, pins=pins)) == {old_id, rotated.active_id}
        pinned = json.loads(pins.path.read_text())["registries"][REGISTRY_ID]
        assert pinned["urls"] == [url]

        # A swapped key says the old one is retired: not signed by a trusted key, not believed.
        swapped = ManifestKeys(stranger, [], [bytes(rotated.trusted()[old_id])], REGISTRY_ID)
        state["document"] = _doc(swapped)
        assert set(trusted_keys(client, pins=pins)) == {old_id, rotated.active_id}

        # The registry retires the old key, in a document its current key signs.
        public_old = rotated.trusted()[old_id]
        retired = ManifestKeys(new, [], [public_old], REGISTRY_ID)
        state["document"] = _doc(retired)
        assert set(trusted_keys(client, pins=pins)) == {rotated.active_id}
        assert json.loads(pins.path.read_text())["registries"][REGISTRY_ID]["revoked"] == [old_id]

        # A replayed older document (the old key active or endorsing) does not bring it back.
        for older in (ManifestKeys(old, [], [], REGISTRY_ID), rotated):
            state["document"] = _doc(older)
            assert set(trusted_keys(client, pins=pins)) == {rotated.active_id}

        # A document issued long ago (a replay) is refused, saying so.
        state["document"] = _doc(retired, issued_at="2020-01-01T00:00:00Z")
        with pytest.raises(TrustError) as caught:
            trusted_keys(client, pins=pins)
        assert caught.value.code == "keys_document_stale"
        assert str(KEYS_DOCUMENT_MAX_AGE) in caught.value.detail

        # Once pinned from a signed document, an unsigned one is refused.
        unsigned = _doc(retired)
        del unsigned["signed"]
        state["document"] = unsigned
        with pytest.raises(TrustError) as caught:
            trusted_keys(client, pins=pins)
        assert caught.value.code == "bad_keys" and "without the signature" in caught.value.detail


@pytest.mark.parametrize(
    "document, says",
    [
        ({"keys": [{"public_key": "x", "endorsements": ["x"]}]}, "endorsements[0]"),
        ({"keys": ["x"]}, "keys[0] is not an object"),
        ({"keys": {"a": 1}}, "no `keys` list"),
        ([1, 2], "no `keys` list"),
        ({"keys": [{"public_key": 5}]}, "public_key is not a string"),
    ],
)
def test_a_malformed_keys_document_is_a_clear_error(
    tmp_path: Path, document: Any, says: str
) -> None:
    key = ManifestKeys(Ed25519PrivateKey.generate(), [], [], REGISTRY_ID)
    with keys_server() as (url, state), RegistryClient(url) as client:
        good = _doc(key)
        if isinstance(document, dict) and document.get("keys") and "endorsements" in str(document):
            document = {**good, "keys": [{**good["keys"][0], "endorsements": ["x"]}]}
        state["document"] = document
        with pytest.raises(TrustError) as caught:
            trusted_keys(client, pins=PinStore(tmp_path))
        assert caught.value.code == "bad_keys" and says in caught.value.detail
        # Also when the keys were pinned before (the endorsement path).
        state["document"] = good
        trusted_keys(client, pins=PinStore(tmp_path / "pinned"))
        state["document"] = document
        with pytest.raises(TrustError) as caught:
            trusted_keys(client, pins=PinStore(tmp_path / "pinned"))
        assert caught.value.code == "bad_keys"

        # The CLI prints the code and exits 1, without a traceback.
        done = subprocess.run(
            [sys.executable, "-m", "tensor_registry.cli", "trust", "--url", url],
            cwd=ROOT,
            env={
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": str(ROOT),
                "HOME": str(tmp_path),
                "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "cli"),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "bad_keys" in done.stderr and "Traceback" not in done.stderr
