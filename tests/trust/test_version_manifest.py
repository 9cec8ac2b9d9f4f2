"""``GET /api/v1/models/{id}/versions/{n}/manifest``: a ready version's files, signed.

Through HTTP on both databases: the envelope verifies with the published key, its subjects are
the version's files, the source URI is redacted, a draft is refused with 409, another
namespace's token is refused as the other version routes refuse it, and a changed payload no
longer verifies. The client's ``verify_version_manifest`` against a real ``serve``."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from sqlalchemy import text

from app.client import RegistryClient
from app.client.manifest import VERSION_PREDICATE_TYPE, ManifestError, verify
from app.client.trust import TrustError, keys_from_document, verify_version_manifest
from app.db import create_engine
from app.settings import Settings
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

    from app.client.trust import PinStore

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
