"""``GET /api/v1/models/{id}/versions/{n}/manifest``: a ready version's files, signed.

Through HTTP on both databases: the envelope verifies with the published key, its subjects are
the version's files, the source URI is redacted, a draft is refused with 409, another
namespace's token is refused as the other version routes refuse it, and a changed payload no
longer verifies. The client's ``verify_version_manifest`` and ``tensor-registry verify
NS/NAME[:REF] --version-manifest`` against a real ``serve``, also through a proxy that swaps or
edits what the registry signed."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from harness.loopback import serving
from tensor_registry import RegistryClient
from tensor_registry.formats.signed_manifest import VERSION_PREDICATE_TYPE, ManifestError, verify
from tensor_registry.trust import TrustError, keys_from_document, verify_version_manifest
from tensor_registry_server.core.db import create_engine
from tensor_registry_server.settings import Settings
from tensor_registry_server.trust.signing_keys import manifest_keys
from tests.client.conftest import Registry, registry  # noqa: F401 (fixtures)
from tests.factories import auth, create_model, create_token, ready_version


async def _published_keys(client: httpx.AsyncClient) -> dict[str, bytes]:
    r = await client.get("/.well-known/tensor-registry/keys")
    assert r.status_code == 200, r.text
    return keys_from_document(r.json())


async def test_a_ready_versions_manifest_verifies_and_lists_its_files(
    client: httpx.AsyncClient,
) -> None:
    model = await create_model(client, name="acme/signed")
    version = await ready_version(client, model["id"])
    r = await client.get(f"/api/v1/models/{model['id']}/versions/1/manifest")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    signed = verify(r.content, await _published_keys(client), predicate_type=VERSION_PREDICATE_TYPE)
    assert signed.statement["predicateType"] == VERSION_PREDICATE_TYPE
    want = {f["path"]: f["sha256"] for f in version["files"]}
    assert {s["name"]: s["digest"]["sha256"] for s in signed.statement["subject"]} == want
    assert {p: (f.size, f.sha256) for p, f in signed.files.items()} == {
        f["path"]: (f["size"], f["sha256"]) for f in version["files"]
    }
    bound = signed.predicate["version"]
    assert (bound["model"], bound["model_id"], bound["number"]) == ("acme/signed", model["id"], 1)
    assert bound["finalized_at"] and bound["id"] == version["id"]
    # An artifact manifest check refuses it: the predicate types are not interchangeable.
    with pytest.raises(ManifestError) as caught:
        verify(r.content, await _published_keys(client))
    assert caught.value.code == "bad_manifest"


async def test_a_changed_payload_no_longer_verifies(client: httpx.AsyncClient) -> None:
    model = await create_model(client, name="acme/tampered")
    await ready_version(client, model["id"])
    r = await client.get(f"/api/v1/models/{model['id']}/versions/1/manifest")
    assert r.status_code == 200, r.text
    envelope = r.json()
    body = json.loads(base64.b64decode(envelope["payload"]))
    body["subject"][0]["digest"]["sha256"] = "0" * 64
    body["predicate"]["files"][0]["sha256"] = "0" * 64
    envelope["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    with pytest.raises(ManifestError) as caught:
        verify(
            json.dumps(envelope).encode(),
            await _published_keys(client),
            predicate_type=VERSION_PREDICATE_TYPE,
        )
    assert caught.value.code == "signature_invalid"


async def test_a_draft_is_refused_and_other_namespaces_are_refused_as_elsewhere(
    client: httpx.AsyncClient,
) -> None:
    model = await create_model(client, name="acme/drafty")
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    assert r.status_code == 201, r.text
    r = await client.get(f"/api/v1/models/{model['id']}/versions/1/manifest")
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "version_not_ready"
    r = await client.get(f"/api/v1/models/{model['id']}/versions/2/manifest")
    assert r.status_code == 404 and r.json()["code"] == "version_not_found"

    await ready_version(client, model["id"])  # version 2
    other = auth(await create_token(client, scopes=["models:read"], namespaces=["other"]))
    version_route = await client.get(f"/api/v1/models/{model['id']}/versions/2", headers=other)
    manifest = await client.get(f"/api/v1/models/{model['id']}/versions/2/manifest", headers=other)
    assert version_route.status_code in (403, 404)
    assert (manifest.status_code, manifest.json()["code"]) == (
        version_route.status_code,
        version_route.json()["code"],
    )
    mine = auth(await create_token(client, scopes=["models:read"], namespaces=["acme"]))
    r = await client.get(f"/api/v1/models/{model['id']}/versions/2/manifest", headers=mine)
    assert r.status_code == 200, r.text
    no_read = auth(await create_token(client, scopes=["resolve"]))
    r = await client.get(f"/api/v1/models/{model['id']}/versions/2/manifest", headers=no_read)
    assert r.status_code == 403, r.text


async def test_the_source_uri_is_signed_redacted(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await create_model(client, name="acme/imported")
    await ready_version(client, model["id"])
    # As an import leaves it: the raw URI (credentials included) on the row, for the job.
    engine = create_engine(settings.database_url)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE versions SET source_uri = :uri"),
            {"uri": "s3://AKIA:secret@bucket/llama?X-Amz-Signature=sig#frag"},
        )
    await engine.dispose()
    r = await client.get(f"/api/v1/models/{model['id']}/versions/1/manifest")
    assert r.status_code == 200, r.text
    signed = verify(r.content, await _published_keys(client), predicate_type=VERSION_PREDICATE_TYPE)
    assert signed.predicate["version"]["source"] == "s3://bucket/llama"
    for secret in ("AKIA", "secret", "X-Amz-Signature", "sig#frag"):
        assert secret not in base64.b64decode(r.json()["payload"]).decode()


def test_the_client_checks_a_version_manifest_against_pinned_keys(
    registry: Registry,  # noqa: F811
    tmp_path: object,
) -> None:
    from pathlib import Path

    from tensor_registry.trust import PinStore

    model = registry.ready_model("acme/client-signed")
    pins = PinStore(Path(str(tmp_path)))
    with RegistryClient(registry.url, registry.token) as client:
        signed = verify_version_manifest(client, model["id"], 1, pins=pins)
        assert pins.get(client.url)  # pinned on first use
        assert signed.predicate["version"]["number"] == 1
        files = {f["path"]: f["sha256"] for f in client.get_version(model["id"], 1)["files"]}
        assert {p: f.sha256 for p, f in signed.files.items()} == files
        with pytest.raises(TrustError) as caught:  # a key that did not sign it
            verify_version_manifest(
                client, model["id"], 1, trusted=[base64.b64encode(b"\x01" * 32).decode()]
            )
        assert caught.value.code == "untrusted_signing_key"


# ---------------------------------------------------------------------------------------------
# `tensor-registry verify NS/NAME[:REF] --version-manifest`


@contextmanager
def tampering_proxy(upstream: str, tamper: Callable[[str, bytes], bytes]) -> Iterator[str]:
    """A proxy on 127.0.0.1 in front of ``upstream`` that passes GETs through, each answer's
    body first given to ``tamper(path, body)``: what sits between a node and its registry."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() == "authorization"}
            with httpx.Client(base_url=upstream, timeout=30) as http:
                answer = http.get(self.path, headers=headers)
            body = tamper(self.path, answer.content)
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "text/plain"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url


def _cli_env(tmp_path: Path) -> dict[str, str | None]:
    return {
        "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "client-config"),
        "TENSOR_REGISTRY_TRUSTED_KEYS": None,
    }


def _registry_key(serve: Registry) -> str:
    return base64.b64encode(manifest_keys(serve.settings).public[0].public_key).decode()


def test_verify_version_manifest_prints_the_signed_files(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    name = f"acme/vm-{os.urandom(4).hex()}"
    model = registry.ready_model(name, versions=2)
    with registry.http() as http:
        r = http.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})
        assert r.status_code == 201, r.text
        listed = {}
        for number in (1, 2):
            version = http.get(f"/api/v1/models/{model['id']}/versions/{number}").json()
            listed[number] = {(f["path"], f["size"], f["sha256"]) for f in version["files"]}
    env = _cli_env(tmp_path)

    done = registry.cli("verify", f"{name}:prod", "--version-manifest", "--json", env=env)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["model"], summary["model_id"], summary["version"]) == (name, model["id"], 1)
    assert summary["signed_by"] == manifest_keys(registry.settings).active_id
    assert summary["signed_at"] and summary["finalized_at"] and summary["source"] is None
    assert {(f["path"], f["size"], f["sha256"]) for f in summary["files"]} == listed[1]
    # Trust on first use pinned the registry's key.
    pins = json.loads((tmp_path / "client-config" / "trusted-keys.json").read_text())
    assert list(pins["registries"][manifest_keys(registry.settings).registry_id]["keys"]) == [
        summary["signed_by"]
    ]

    # Without a ref: the latest ready version, as a table.
    shown = registry.cli("verify", name, "--version-manifest", env=env)
    assert shown.returncode == 0, shown.stderr
    first, header, *rows = shown.stdout.splitlines()
    assert first.startswith(f"{name} version 2: signed manifest verified (key ")
    assert header.split() == ["PATH", "SIZE", "SHA256"]
    assert {(row.split()[0], row.split()[-1]) for row in rows} == {
        (path, sha) for path, _, sha in listed[2]
    }


def test_verify_version_manifest_refuses_what_the_registry_did_not_sign(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    name = f"acme/vm-{os.urandom(4).hex()}"
    model = registry.ready_model(name, versions=2)
    env = _cli_env(tmp_path)
    ours = _registry_key(registry)

    def refused(*args: str, url: str | None = None) -> str:
        extra = ["--url", url] if url else []
        done = registry.cli("verify", *args, "--version-manifest", *extra, env=env)
        assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
        return done.stderr

    # Checked with keys that are not the registry's.
    stranger = base64.b64encode(os.urandom(32)).decode()
    assert "untrusted_signing_key" in refused(f"{name}:1", "--trusted-key", stranger)

    # A proxy answers version 1 with version 2's manifest, validly signed by the registry.
    with registry.http() as http:
        version_2 = http.get(f"/api/v1/models/{model['id']}/versions/2/manifest").content
    route_1 = f"/api/v1/models/{model['id']}/versions/1/manifest"

    def substitute(path: str, body: bytes) -> bytes:
        return version_2 if path == route_1 else body

    with tampering_proxy(registry.url, substitute) as proxy:
        error = refused(f"{name}:1", "--trusted-key", ours, url=proxy)
    assert "manifest_mismatch" in error and "version 2" in error, error

    # A proxy edits a file's digest in the signed payload.
    def edit(path: str, body: bytes) -> bytes:
        if path != route_1:
            return body
        envelope = json.loads(body)
        statement = json.loads(base64.b64decode(envelope["payload"]))
        statement["predicate"]["files"][0]["sha256"] = "0" * 64
        statement["subject"][0]["digest"]["sha256"] = "0" * 64
        envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        return json.dumps(envelope).encode()

    with tampering_proxy(registry.url, edit) as proxy:
        assert "signature_invalid" in refused(f"{name}:1", "--trusted-key", ours, url=proxy)
        # Trust on first use through the proxy pins the registry's keys it passes on: the
        # edit still fails.
        assert "signature_invalid" in refused(f"{name}:1", url=proxy)

    # A draft's files can still change: nothing is signed for it.
    with registry.http() as http:
        assert http.post(f"/api/v1/models/{model['id']}/versions", json={}).status_code == 201
    assert "version_not_ready" in refused(f"{name}:3")
    # A directory is an artifact's: the flag is for a registry's version.
    assert "give NS/NAME[:REF]" in refused(str(tmp_path))
