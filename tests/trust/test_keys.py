"""The manifest-signing keys: the embedded default's generated key file, the public route
(no auth, declared in OpenAPI, never the private key), rotation with endorsements, and the
compatibility key's inputs."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

import httpx
import pytest

from tensor_registry.formats.signed_manifest import (
    ManifestError,
    compatibility_key,
    ed25519_verify,
    endorsement_message,
    verify,
)
from tensor_registry.trust import endorsed_keys, keys_from_document
from tensor_registry_server.settings import Settings
from tensor_registry_server.trust.signing_keys import KEY_FILE, manifest_keys, public_key_b64


def _seed() -> str:
    return base64.b64encode(os.urandom(32)).decode()


async def test_public_keys_route_needs_no_token_and_never_shows_the_private_key(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    r = await client.get("/.well-known/tensor-registry/keys", headers={"Authorization": ""})
    assert r.status_code == 200, r.text
    body = r.json()
    (key,) = body["keys"]
    raw = base64.b64decode(key["public_key"])
    assert len(raw) == 32 and key["keyid"] == hashlib.sha256(raw).hexdigest() == body["active"]
    assert (key["algorithm"], key["status"], key["endorsements"]) == ("ed25519", "active", [])
    path = settings.data_dir.resolve() / "secrets" / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    seed = path.read_text().strip()
    assert seed not in r.text and base64.b64decode(seed).hex() not in r.text
    assert public_key_b64(seed) == key["public_key"]
    spec = (await client.get("/openapi.json")).json()
    assert "/.well-known/tensor-registry/keys" in spec["paths"]
    # Issue 26: the identity, and the document signed by the active key (fresh issued_at).
    from tensor_registry.formats.signed_manifest import KEYS_PREDICATE_TYPE

    assert body["registry_id"] == manifest_keys(settings).registry_id
    statement = verify(
        body["signed"].encode(), {key["keyid"]: raw}, predicate_type=KEYS_PREDICATE_TYPE
    )
    assert statement.predicate["registry_id"] == body["registry_id"]
    assert statement.predicate["issued_at"].startswith("20")


def test_rotation_publishes_old_keys_and_endorses_the_new_one(tmp_path: Path) -> None:
    old, new = _seed(), _seed()
    retired = public_key_b64(_seed())
    rotated = Settings(
        data_dir=tmp_path,
        security={  # type: ignore[arg-type]
            "manifest_signing_key": new,
            "manifest_previous_keys": [old],
            "manifest_retired_public_keys": [retired],
        },
    )
    keys = manifest_keys(rotated)
    assert not (tmp_path / "secrets" / KEY_FILE).exists()  # configured: nothing generated
    document = keys.document()
    statuses = [k["status"] for k in document["keys"]]
    assert statuses == ["active", "previous", "retired"]
    active = document["keys"][0]
    (endorsement,) = active["endorsements"]
    old_public = base64.b64decode(public_key_b64(old))
    assert endorsement["keyid"] == hashlib.sha256(old_public).hexdigest()
    new_public = base64.b64decode(active["public_key"])
    assert ed25519_verify(
        old_public, base64.b64decode(endorsement["sig"]), endorsement_message(new_public)
    )
    assert new not in repr(keys) and old not in repr(keys)

    # A client that pinned only the old key accepts the endorsed new one, not a stranger.
    pinned = {hashlib.sha256(old_public).hexdigest(): old_public}
    grown = endorsed_keys(document, pinned)
    assert set(grown) == {hashlib.sha256(old_public).hexdigest(), keys.active_id}
    stranger = Settings(data_dir=tmp_path, security={"manifest_signing_key": _seed()})  # type: ignore[arg-type]
    assert endorsed_keys(manifest_keys(stranger).document(), pinned) == pinned
    # Manifests signed with the old key still verify with what the route publishes.
    before = Settings(data_dir=tmp_path, security={"manifest_signing_key": old})  # type: ignore[arg-type]
    from tensor_registry.formats.signed_manifest import ManifestFile, statement

    payload = statement(
        files=[ManifestFile("model.tensors", 3, "a" * 64)], predicate={"artifact": {"id": "x"}}
    )
    signed_before = manifest_keys(before).sign(payload)
    assert verify(signed_before, keys_from_document(document)).key_id == pinned.popitem()[0]
    with pytest.raises(ManifestError) as caught:
        verify(signed_before, {keys.active_id: new_public})
    assert caught.value.code == "untrusted_signing_key"


BASE = {
    "architecture": "LlamaForCausalLM",
    "config_sha256": "1" * 64,
    "dtype": "bfloat16",
    "format": "vllm",
    "tensor_parallel_size": 2,
    "quantization": None,
    "vllm_version": "0.6.3",
    "gpu_arch": "sm_90",
}


@pytest.mark.parametrize(
    "change",
    [
        {"config_sha256": "2" * 64},
        {"architecture": "MistralForCausalLM"},
        {"dtype": "float16"},
        {"tensor_parallel_size": 4},
        {"vllm_version": "0.7.0"},
        {"gpu_arch": "sm_80"},
        {"quantization": {"quant_method": "fp8"}},
        {"format": "hf"},
    ],
)
def test_the_compatibility_key_changes_with_what_decides_reuse(change: dict[str, object]) -> None:
    assert compatibility_key(**{**BASE, **change}) != compatibility_key(**BASE)  # type: ignore[arg-type]


def test_the_compatibility_key_ignores_what_does_not_decide_reuse() -> None:
    assert compatibility_key(**BASE) == compatibility_key(**dict(BASE))  # type: ignore[arg-type]
    hf = {**BASE, "format": "hf"}
    # vLLM version and GPU architecture do not matter for hf-format weights.
    assert compatibility_key(**hf) == compatibility_key(  # type: ignore[arg-type]
        **{**hf, "vllm_version": "0.9.9", "gpu_arch": "sm_100"}
    )
    assert compatibility_key(**BASE) == compatibility_key(  # type: ignore[arg-type]
        **{**BASE, "config_sha256": "1" * 64}
    )


def test_the_registry_identity_is_generated_once_or_configured_and_the_document_is_signed(
    tmp_path: Path,
) -> None:
    from tensor_registry.formats.signed_manifest import KEYS_PREDICATE_TYPE

    first = manifest_keys(Settings(data_dir=tmp_path))
    again = manifest_keys(Settings(data_dir=tmp_path))  # another process, same data dir
    ident = (tmp_path / "secrets" / "registry-id").read_text().strip()
    assert first.registry_id == again.registry_id == ident and ident.startswith("tr-")
    configured = manifest_keys(
        Settings(data_dir=tmp_path / "b", security={"registry_id": "acme-registry-1"})  # type: ignore[arg-type]
    )
    assert configured.registry_id == "acme-registry-1"
    with pytest.raises(ValueError):
        Settings(security={"registry_id": "no spaces allowed"})  # type: ignore[arg-type]

    document = first.document(issued_at="2026-01-01T00:00:00Z")
    assert document["registry_id"] == ident
    signed = verify(
        document["signed"].encode(), first.trusted(), predicate_type=KEYS_PREDICATE_TYPE
    )
    assert signed.predicate["registry_id"] == ident
    assert signed.predicate["issued_at"] == "2026-01-01T00:00:00Z"
    assert [(k["keyid"], k["status"]) for k in signed.predicate["keys"]] == [
        (first.active_id, "active")
    ]
    with pytest.raises(ManifestError):  # another registry's key does not verify it
        verify(
            document["signed"].encode(),
            manifest_keys(Settings(data_dir=tmp_path / "c")).trusted(),
            predicate_type=KEYS_PREDICATE_TYPE,
        )
