"""GET /api/v1/resolve: choosing the artifact, signed URLs that download, the vllm block, audit.

Artifacts are written with tensorizer straight into local storage (harness/artifacts.py);
downloads go through the real signed blob route of the same app.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from harness.artifacts import make_artifact
from tensor_registry.formats.model_signature import KEYFILE_PATH
from tensor_registry_server.auth import PrincipalCache
from tensor_registry_server.resolve.schemas import ResolveOut
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage import signing
from tests.factories import auth, create_model, create_token, ready_version

# vLLM's TensorizerConfig init fields (docs/tensorizer-vllm-facts.md §1.1), and the subset that
# both the current vLLM and vLLM 0.9 (which passes the JSON as **kwargs: unknown keys raise
# TypeError) accept (§1.2). device/dtype/mode are rejected outright by the current loader.
VLLM_NEW_FIELDS = {
    "tensorizer_uri",
    "tensorizer_dir",
    "vllm_tensorized",
    "verify_hash",
    "num_readers",
    "encryption_keyfile",
    "s3_access_key_id",
    "s3_secret_access_key",
    "s3_endpoint",
    "lora_dir",
    "stream_kwargs",
    "serialization_kwargs",
    "deserialization_kwargs",
}
VLLM_09_FIELDS = {
    "tensorizer_uri",
    "vllm_tensorized",
    "verify_hash",
    "num_readers",
    "encryption_keyfile",
    "s3_access_key_id",
    "s3_secret_access_key",
    "s3_endpoint",
}
VLLM_BLACKLIST = {"device", "dtype", "mode"}


async def _resolve(client: httpx.AsyncClient, **params: Any) -> httpx.Response:
    return await client.get("/api/v1/resolve", params={"model": "acme/llama", **params})


async def _model_with_versions(client: httpx.AsyncClient, count: int = 1) -> dict[str, Any]:
    model = await create_model(client, name="acme/llama")
    for _ in range(count):
        await ready_version(client, model["id"])
    return model


async def _audit(app: FastAPI, client: httpx.AsyncClient, action: str) -> list[dict[str, Any]]:
    await app.state.resolve_audit.flush()
    r = await client.get("/api/v1/audit", params={"action": action})
    assert r.status_code == 200
    return list(r.json()["items"])


def check_vllm_config(body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM does with model_loader_extra_config, minus vLLM: parse, filter, construct."""
    args = body["vllm"]["args"]
    assert args[:3] == ["--load-format", "tensorizer", "--model-loader-extra-config"]
    extra = json.loads(args[3])
    assert extra == body["vllm"]["model_loader_extra_config"]
    assert set(extra) <= VLLM_09_FIELDS <= VLLM_NEW_FIELDS
    assert not set(extra) & VLLM_BLACKLIST

    @dataclasses.dataclass
    class TensorizerConfig09:  # the 0.9 constructor: every key must be a field
        tensorizer_uri: str | None = None
        vllm_tensorized: bool | None = False
        verify_hash: bool | None = False
        num_readers: int | None = None
        encryption_keyfile: str | None = None
        s3_access_key_id: str | None = None
        s3_secret_access_key: str | None = None
        s3_endpoint: str | None = None

    TensorizerConfig09(**extra)
    sharded = re.search(r"%0\dd", extra["tensorizer_uri"]) is not None
    assert sharded == (body["artifact"]["tensor_parallel_size"] > 1)
    return dict(extra)


async def test_resolve_mints_urls_that_download_the_exact_bytes(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    made = await make_artifact(settings, model="acme/llama", version=1)
    r = await _resolve(client, ttl=120, node="node-7")
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    body = r.json()
    ResolveOut.model_validate(body)
    assert (body["model"], body["version"], body["ref"]) == ("acme/llama", 1, "latest")
    assert body["artifact"]["id"] == str(made.id)
    assert body["artifact"]["encryption"] == {"enabled": False, "key_id": None, "algorithm": None}
    assert body["encryption_key_url"] is None
    assert body["deserializer"] == {"num_readers": 4, "verify_hash": True}
    assert {f["path"]: (f["size"], f["sha256"]) for f in body["files"]} == {
        path: (len(data), made.sha256(path)) for path, data in made.files.items()
    }
    assert {f["path"]: f["kind"] for f in body["files"]} == {
        "config.json": "config",
        "model.tensors": "weights",
        "tokenizer.json": "config",
    }
    weights = next(f for f in body["files"] if f["path"] == "model.tensors")
    assert body["tensorizer_uri"] == weights["url"] == body["tensorizer_uris"][0]
    assert "%" not in body["tensorizer_uri"]
    for f in body["files"]:
        got = await client.get(f["url"], headers={"Authorization": ""})
        assert got.status_code == 200, got.text
        assert got.content == made.files[f["path"]]
    ranged = await client.get(weights["url"], headers={"Range": "bytes=100-199"})
    assert ranged.status_code == 206 and ranged.content == made.files["model.tensors"][100:200]

    extra = check_vllm_config(body)
    assert extra == {"tensorizer_uri": weights["url"], "num_readers": 4, "verify_hash": True}
    assert body["vllm"]["keyfile"] is None

    [row] = await _audit(app, client, "resolve")
    assert row["target_id"] == str(made.id) and row["model"] == "acme/llama"
    assert row["detail"]["node"] == "node-7" and row["detail"]["ttl"] == 120
    assert row["actor_name"] and row["request_id"] == r.headers["x-request-id"]


async def test_ref_picks_alias_number_or_latest_and_the_newest_variant_wins(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    model = await _model_with_versions(client, count=3)
    v1 = await make_artifact(settings, model="acme/llama", version=1)
    old = await make_artifact(settings, model="acme/llama", version=2, age_seconds=60)
    new = await make_artifact(
        settings, model="acme/llama", version=2, dtype="bfloat16", age_seconds=1
    )
    await make_artifact(settings, model="acme/llama", version=3, status="running")
    await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})

    async def picked(**params: Any) -> str:
        r = await _resolve(client, **params)
        assert r.status_code == 200, r.text
        return str(r.json()["artifact"]["id"])

    assert await picked(ref="prod") == str(v1.id)
    assert await picked(ref="2") == str(new.id)
    assert await picked(ref="2", dtype="float32") == str(old.id)
    # latest = version 3 (the highest ready version), whose only artifact is still running.
    missing = await _resolve(client)
    assert missing.status_code == 404
    problem = missing.json()
    assert problem["code"] == "no_matching_artifact" and problem["version"] == 3
    assert problem["available"] == [
        {
            "version": 3,
            "dtype": "float32",
            "format": "hf",
            "tensor_parallel_size": 1,
            "encrypted": False,
            "status": "running",
        }
    ]
    assert problem["versions_with_match"] == [2, 1]
    assert missing.headers["content-type"] == "application/problem+json"


async def test_no_matching_artifact_lists_what_exists(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    await make_artifact(settings, model="acme/llama", version=1, dtype="float16")
    r = await _resolve(client, dtype="bfloat16", format="vllm", tensor_parallel_size=2)
    assert r.status_code == 404
    body = r.json()
    assert body["code"] == "no_matching_artifact"
    assert "dtype=bfloat16" in body["detail"] and "format=vllm" in body["detail"]
    assert [(a["dtype"], a["format"], a["status"]) for a in body["available"]] == [
        ("float16", "hf", "ready")
    ]
    assert body["versions_with_match"] == []


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"model": "acme/nope"}, 404, "model_not_found"),
        ({"ref": "canary"}, 404, "alias_not_found"),
        ({"ref": "9"}, 404, "version_not_found"),
        ({"ref": "Bad Ref!"}, 422, "invalid_ref"),
        ({"model": "not a name"}, 422, "invalid_model_name"),
        ({"dtype": "int8"}, 422, "validation_error"),
        ({"tensor_parallel_size": "0"}, 422, "validation_error"),
        ({"dtpye": "float16"}, 422, "validation_error"),
        ({"ttl": str(10**9)}, 422, "ttl_too_long"),
    ],
)
async def test_bad_questions_get_clear_problems(
    client: httpx.AsyncClient, settings: Settings, params: dict[str, str], status: int, code: str
) -> None:
    await _model_with_versions(client)
    await make_artifact(settings, model="acme/llama", version=1)
    r = await client.get("/api/v1/resolve", params={"model": "acme/llama", **params})
    assert r.status_code == status, r.text
    assert r.json()["code"] == code
    assert r.headers["content-type"] == "application/problem+json"


async def test_scope_and_namespace_are_enforced(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    await make_artifact(settings, model="acme/llama", version=1)
    reader = await create_token(client, scopes=["models:read"])
    other_ns = await create_token(client, scopes=["resolve"], namespaces=["other"])
    resolver = await create_token(client, scopes=["resolve"], namespaces=["acme"])
    anonymous = await client.get(
        "/api/v1/resolve", params={"model": "acme/llama"}, headers={"Authorization": ""}
    )
    assert anonymous.status_code == 401
    r = await client.get("/api/v1/resolve", params={"model": "acme/llama"}, headers=auth(reader))
    assert (r.status_code, r.json()["code"]) == (403, "insufficient_scope")
    # The namespace is checked before the model is looked up: nothing leaks about other names.
    for name in ("acme/llama", "acme/absent"):
        r = await client.get("/api/v1/resolve", params={"model": name}, headers=auth(other_ns))
        assert (r.status_code, r.json()["code"]) == (403, "namespace_forbidden")
    r = await client.get("/api/v1/resolve", params={"model": "acme/llama"}, headers=auth(resolver))
    assert r.status_code == 200
    bogus = await client.get(
        "/api/v1/resolve", params={"model": "acme/llama"}, headers=auth("trg_" + "x" * 43)
    )
    assert (bogus.status_code, bogus.json()["code"]) == (401, "invalid_token")


async def test_revoked_and_expiring_tokens_stop_resolving_within_the_principal_ttl(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    await make_artifact(settings, model="acme/llama", version=1)
    now = [0.0]
    app.state.principal_cache = PrincipalCache(ttl=0.5, clock=lambda: now[0])
    created = await client.post("/api/v1/tokens", json={"name": "node", "scopes": ["resolve"]})
    token, token_id = created.json()["token"], created.json()["id"]
    params = {"model": "acme/llama"}
    assert (
        await client.get("/api/v1/resolve", params=params, headers=auth(token))
    ).status_code == 200
    assert (await client.delete(f"/api/v1/tokens/{token_id}")).status_code == 204
    # Cached for at most the principal TTL (the signed URLs it already holds live longer).
    now[0] += 0.6
    r = await client.get("/api/v1/resolve", params=params, headers=auth(token))
    assert (r.status_code, r.json()["code"]) == (401, "invalid_token")

    # Long enough that the first resolve below comes before it on a loaded machine (1.5 s was
    # not: CI once created the token and resolved after it had expired).
    soon = (datetime.now(UTC) + timedelta(seconds=4)).isoformat()
    short = await client.post(
        "/api/v1/tokens", json={"name": "short", "scopes": ["resolve"], "expires_at": soon}
    )
    assert short.status_code == 201, short.text
    app.state.principal_cache = PrincipalCache(ttl=60)
    headers = auth(short.json()["token"])
    assert (await client.get("/api/v1/resolve", params=params, headers=headers)).status_code == 200
    # Expiry is wall-clock time in the database: wait until that instant has passed.
    while datetime.now(UTC) <= datetime.fromisoformat(soon) + timedelta(seconds=0.05):
        await asyncio.sleep(0.05)
    # Never served from the cache past the token's own expiry, whatever the TTL.
    r = await client.get("/api/v1/resolve", params=params, headers=headers)
    assert (r.status_code, r.json()["code"]) == (401, "token_expired")


async def test_tensor_parallel_template_fills_to_each_rank_file(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    made = await make_artifact(settings, model="acme/llama", version=1, tensor_parallel_size=3)
    r = await _resolve(client, tensor_parallel_size=3)
    assert r.status_code == 200, r.text
    body = r.json()
    uri = body["tensorizer_uri"]
    assert uri.count("%") == 1 and "model-rank-%03d.tensors?" in uri
    urls = {f["path"]: f["url"] for f in body["files"]}
    for rank in range(3):
        path = f"model-rank-{rank:03d}.tensors"
        assert uri % rank == urls[path] == body["tensorizer_uris"][rank]
        got = await client.get(uri % rank)
        assert got.status_code == 200 and got.content == made.files[path]
    assert (await client.get(uri % 3)).json()["code"] == "blob_not_found"
    extra = check_vllm_config(body)
    assert extra["tensorizer_uri"] == uri
    assert body["vllm"]["args"][-4:] == ["--tensor-parallel-size", "3", "--dtype", "float32"]


async def test_reader_advice_and_hash_setting(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    await make_artifact(settings, model="acme/llama", version=1)

    async def advice(**params: Any) -> dict[str, Any]:
        r = await _resolve(client, **params)
        assert r.status_code == 200, r.text
        assert (
            r.json()["vllm"]["model_loader_extra_config"]["num_readers"]
            == (r.json()["deserializer"]["num_readers"])
        )
        return dict(r.json()["deserializer"])

    assert await advice() == {"num_readers": 4, "verify_hash": True}
    assert await advice(cpu_count=2) == {"num_readers": 1, "verify_hash": True}
    assert await advice(cpu_count=96) == {"num_readers": 16, "verify_hash": True}
    assert await advice(num_readers=12, cpu_count=4, verify_hash="false") == {
        "num_readers": 12,
        "verify_hash": False,
    }


async def test_encrypted_artifact_key_url_only_with_keys_read(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    made = await make_artifact(settings, model="acme/llama", version=1, encrypted=True)
    assert made.key is not None
    plain_token = await create_token(client, scopes=["resolve"])
    key_token = await create_token(client, scopes=["resolve", "keys:read"], name="keys")

    without = await client.get(
        "/api/v1/resolve", params={"model": "acme/llama"}, headers=auth(plain_token)
    )
    assert without.status_code == 200
    body = without.json()
    assert body["artifact"]["encryption"]["enabled"] is True
    assert body["artifact"]["encryption"]["algorithm"] == "tensorizer-xsalsa20-poly1305"
    assert body["encryption_key_url"] is None
    assert "/keys/" not in json.dumps(body)
    # Where `pull` writes it, relative to its DEST: the node state directory.
    assert KEYFILE_PATH == ".cache/tensor-registry/tensorizer.key"
    assert body["vllm"]["keyfile"] == {"path": KEYFILE_PATH, "source": "file"}
    assert check_vllm_config(body)["encryption_keyfile"] == KEYFILE_PATH
    refused = await client.get(
        "/api/v1/resolve",
        params={"model": "acme/llama", "embed_key_url": "true"},
        headers=auth(plain_token),
    )
    assert (refused.status_code, refused.json()["code"]) == (403, "insufficient_scope")

    with_key = await client.get(
        "/api/v1/resolve",
        params={"model": "acme/llama", "keyfile": "/srv/llama/tensorizer.key"},
        headers=auth(key_token),
    )
    body = with_key.json()
    key_url = body["encryption_key_url"]
    assert key_url.startswith(f"http://testserver/api/v1/keys/{made.id}?exp=")
    # The vllm block names the local file, not the capability (vLLM logs its config).
    assert key_url not in json.dumps(body["vllm"])
    assert check_vllm_config(body)["encryption_keyfile"] == "/srv/llama/tensorizer.key"
    # vLLM reads the key several times per rank: the URL serves it until it expires.
    for _ in range(3):
        fetched = await client.get(key_url, headers={"Authorization": ""})
        assert fetched.status_code == 200
        assert fetched.headers["content-type"] == "application/octet-stream"
        assert fetched.headers["cache-control"] == "no-store"
        assert fetched.content == made.key and len(fetched.content) == 32

    embedded = await client.get(
        "/api/v1/resolve",
        params={"model": "acme/llama", "embed_key_url": "true"},
        headers=auth(key_token),
    )
    body = embedded.json()
    assert body["vllm"]["keyfile"]["source"] == "url"
    assert check_vllm_config(body)["encryption_keyfile"] == body["encryption_key_url"]

    issued = await _audit(app, client, "key.issue")
    assert len(issued) == 2 and {e["actor_name"] for e in issued} == {"keys"}
    assert issued[-1]["target_id"] == str(made.id) and issued[-1]["detail"]["key_id"]
    fetches = await _audit(app, client, "key.fetch")
    assert len(fetches) == 3 and all(f["target_id"] == str(made.id) for f in fetches)
    assert {f["detail"]["exp"] for f in fetches} == {int(key_url.split("exp=")[1].split("&")[0])}
    resolves = await _audit(app, client, "resolve")
    assert sorted(e["detail"]["key_url"] for e in resolves) == [False, True, True]


async def test_key_url_expired_or_altered_is_403_and_reveals_nothing(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    made = await make_artifact(settings, model="acme/llama", version=1, encrypted=True)
    secret = settings.signing_key_bytes()
    base = "http://testserver"
    expired = signing.key_url(base, secret, artifact_id=str(made.id), ttl=-5)
    r = await client.get(expired)
    assert (r.status_code, r.json()["code"]) == (403, "signature_expired")
    assert made.key is not None and made.key not in r.content
    valid = signing.key_url(base, secret, artifact_id=str(made.id), ttl=60)
    exp = int(valid.split("exp=")[1].split("&")[0])
    altered_exp = valid.replace(f"exp={exp}", f"exp={exp + 3600}")
    other_artifact = valid.replace(str(made.id), "00000000-0000-4000-8000-000000000000")
    for url in (altered_exp, other_artifact, valid[:-2] + "xx", valid.split("?")[0]):
        r = await client.get(url)
        assert (r.status_code, r.json()["code"]) == (403, "signature_invalid"), url
    # A blob signature does not open the key route (purposes are separate).
    blob_sig = signing.blob_url(
        base, secret, storage="local", key=f"artifacts/{made.id}/model.tensors", ttl=60
    ).split("?")[1]
    r = await client.get(f"/api/v1/keys/{made.id}?{blob_sig}")
    assert (r.status_code, r.json()["code"]) == (403, "signature_invalid")
    plain = await make_artifact(settings, model="acme/llama", version=1, dtype="float16")
    r = await client.get(signing.key_url(base, secret, artifact_id=str(plain.id), ttl=60))
    assert (r.status_code, r.json()["code"]) == (404, "key_not_found")


async def test_signed_urls_expire(client: httpx.AsyncClient, settings: Settings) -> None:
    await _model_with_versions(client)
    made = await make_artifact(settings, model="acme/llama", version=1)
    key = f"artifacts/{made.id}/model.tensors"
    expired = signing.blob_url(
        "http://testserver", settings.signing_key_bytes(), storage="local", key=key, ttl=-1
    )
    r = await client.get(expired)
    assert (r.status_code, r.json()["code"]) == (403, "signature_expired")


def test_resolve_is_documented_in_openapi() -> None:
    from fastapi.openapi.utils import get_openapi

    from tensor_registry_server.key_delivery.router import router as key_delivery_router
    from tensor_registry_server.resolve.router import router as resolve_router

    routes = [*resolve_router.routes, *key_delivery_router.routes]
    spec = get_openapi(title="t", version="1", routes=routes)
    operation = spec["paths"]["/api/v1/resolve"]["get"]
    names = {p["name"] for p in operation["parameters"]}
    assert {"model", "ref", "dtype", "format", "tensor_parallel_size", "ttl"} <= names
    assert operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert "/api/v1/keys/{artifact_id}" in spec["paths"]


async def test_a_node_with_its_own_key_declines_the_key_url(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    await _model_with_versions(client)
    made = await make_artifact(settings, model="acme/llama", version=1, encrypted=True)
    key_token = await create_token(client, scopes=["resolve", "keys:read"], name="keys")
    own = await client.get(
        "/api/v1/resolve",
        params={"model": "acme/llama", "key_url": "false", "keyfile": "/etc/node/llama.key"},
        headers=auth(key_token),
    )
    assert own.status_code == 200, own.text
    body = own.json()
    assert body["artifact"]["id"] == str(made.id)
    assert body["encryption_key_url"] is None and "/keys/" not in json.dumps(body)
    assert check_vllm_config(body)["encryption_keyfile"] == "/etc/node/llama.key"
    # No key URL issued, so none audited; the resolve row says no key URL went out.
    assert await _audit(app, client, "key.issue") == []
    [resolved] = await _audit(app, client, "resolve")
    assert resolved["detail"]["key_url"] is False
    conflicting = await client.get(
        "/api/v1/resolve",
        params={"model": "acme/llama", "key_url": "false", "embed_key_url": "true"},
        headers=auth(key_token),
    )
    assert (conflicting.status_code, conflicting.json()["code"]) == (422, "conflicting_parameters")


async def test_the_answer_binds_the_ref_and_the_alias_move_and_artifact_id_pins(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    """Issue 26 §2: every answer carries `binding`, signed by the manifest key: model, ref,
    version, artifact and, for an alias, its revision and move time (one more per move); and
    `artifact_id` pins one artifact (a re-resolve mid-download), 404 when it is not the ref's."""
    import base64

    from tensor_registry.formats.signed_manifest import BINDING_PREDICATE_TYPE, verify
    from tensor_registry_server.trust.signing_keys import manifest_keys

    model = await _model_with_versions(client, count=2)
    v1 = await make_artifact(settings, model="acme/llama", version=1)
    v2 = await make_artifact(settings, model="acme/llama", version=2)
    await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})
    keys = manifest_keys(settings)

    async def bound(**params: Any) -> dict[str, Any]:
        r = await _resolve(client, **params)
        assert r.status_code == 200, r.text
        body = r.json()
        ResolveOut.model_validate(body)
        signed = verify(
            body["binding"].encode(), keys.trusted(), predicate_type=BINDING_PREDICATE_TYPE
        )
        assert signed.key_id == keys.active_id
        predicate = signed.predicate
        assert predicate["expires_at"] == body["expires_at"]
        assert predicate["registry_id"] == keys.registry_id
        return predicate

    first = await bound(ref="prod", ttl=60)
    assert (first["model"], first["ref"], first["version"]) == ("acme/llama", "prod", 1)
    assert first["artifact"]["id"] == str(v1.id) and first["artifact"]["dtype"] == "float32"
    assert first["alias"]["name"] == "prod"
    await client.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 2})
    moved = await bound(ref="prod", ttl=60)
    assert moved["version"] == 2 and moved["artifact"]["id"] == str(v2.id)
    assert moved["alias"]["revision"] == first["alias"]["revision"] + 1
    assert moved["alias"]["moved_at"] >= first["alias"]["moved_at"]
    by_number = await bound(ref="1")
    assert by_number["alias"] is None and by_number["ref"] == "1"
    assert base64.b64decode(
        json.loads((await _resolve(client, ref="1")).json()["binding"])["payload"]
    )

    pinned = await _resolve(client, ref="1", artifact_id=str(v1.id))
    assert pinned.status_code == 200 and pinned.json()["artifact"]["id"] == str(v1.id)
    other = await _resolve(client, ref="1", artifact_id=str(v2.id))
    assert other.status_code == 404 and other.json()["code"] == "no_matching_artifact"


async def test_resolve_says_when_a_version_carries_code_that_trust_remote_code_would_run(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    # Issue 36 §4: a checkpoint's custom *.py with auto_map is flagged in resolve as on the
    # model page, so a node's --trust-remote-code is never a surprise.
    import uuid

    from sqlalchemy import update

    from tensor_registry_server.rows.versions import Version

    model = await _model_with_versions(client, count=2)
    await make_artifact(settings, model="acme/llama", version=1)
    await make_artifact(settings, model="acme/llama", version=2)
    code = {
        "auto_map": {"AutoModelForCausalLM": "modeling_fancy.FancyForCausalLM"},
        "files": ["modeling_fancy.py"],
    }
    async with app.state.sessionmaker() as session:
        await session.execute(
            update(Version)
            .where(Version.model_id == uuid.UUID(model["id"]), Version.number == 2)
            .values(remote_code=code)
        )
        await session.commit()
    plain = await _resolve(client, ref="1")
    assert plain.status_code == 200 and plain.json()["remote_code"] is None
    flagged = await _resolve(client, ref="2")
    assert flagged.status_code == 200, flagged.text
    assert flagged.json()["remote_code"] == code
    ResolveOut.model_validate(flagged.json())
