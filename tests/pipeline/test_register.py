"""Registering artifacts tensorized elsewhere: a verify job copies the bytes from the uri into
storage, reads the header lazily (marker, dtypes, names), checks every stored tensor hash and
publishes, or fails with a clear code and publishes nothing."""

from __future__ import annotations

import base64
import hashlib
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from harness.waiting import wait_job
from tensor_registry_server.settings import Settings
from tests.hf_fixtures import make_tiny_llama
from tests.pipeline.helpers import (
    artifact_dir,
    artifact_key,
    assert_files_match_storage,
    deserialize,
    get_artifact,
    publish_dir,
)


def _write_external(
    src: Path,
    out: Path,
    *,
    dtype: torch.dtype,
    names: list[str] | None = None,
    vllm_marker: bool = False,
    key: bytes | None = None,
    companions: bool = True,
) -> Path:
    """What another tensorizer user would produce: plain TensorSerializer.write_module."""
    from tensorizer import EncryptionParams, TensorSerializer
    from transformers import LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    model = LlamaForCausalLM.from_pretrained(str(src), dtype=dtype)
    if vllm_marker:
        # How vLLM marks its own layout: a meta parameter on the root module.
        model.register_parameter(
            "vllm_tensorized_marker",
            torch.nn.Parameter(torch.tensor((1,), device="meta"), requires_grad=False),
        )
    encryption = EncryptionParams(key=key) if key is not None else None
    for name in names or ["model.tensors"]:
        serializer = TensorSerializer(str(out / name), encryption=encryption)
        serializer.write_module(model)
        serializer.close()
    if companions:
        for companion in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / companion, out / companion)
    return out


async def _register(api: httpx.AsyncClient, model_id: str, **body: Any) -> dict[str, Any]:
    r = await api.post(f"/api/v1/models/{model_id}/artifacts", json={"version": 1, **body})
    assert r.status_code == 202, r.text
    assert r.json()["kind"] == "verify"
    return dict(r.json())


async def test_registered_hf_artifact_is_verified_and_published(
    api: httpx.AsyncClient, settings: Settings, import_root: Path, tmp_path: Path
) -> None:
    src = make_tiny_llama(tmp_path / "src")
    model_id, _ = await publish_dir(api, src, name="acme/registered")
    external = _write_external(src, import_root / f"ext-{tmp_path.name}", dtype=torch.float16)
    job = await _register(api, model_id, dtype="float16", format="hf", uri=f"file://{external}/")
    done = await wait_job(api, job["id"])
    assert done["status"] == "succeeded", done["error"]
    artifact = await get_artifact(api, done["artifact_id"])
    assert artifact["status"] == "ready" and artifact["origin"] == "registered"
    assert artifact["stats"]["verified"] is True
    assert {f["path"] for f in artifact["files"]} >= {
        "model.tensors",
        "config.json",
        "tokenizer.json",
    }
    # generation_config.json was not at the uri: it comes from the version.
    assert "generation_config.json" in {f["path"] for f in artifact["files"]}
    assert_files_match_storage(settings, artifact)
    stored = artifact_dir(settings, artifact["id"]) / "model.tensors"
    assert stored.read_bytes() == (external / "model.tensors").read_bytes()
    sha = {f["path"]: f["sha256"] for f in artifact["files"]}["model.tensors"]
    assert sha == hashlib.sha256((external / "model.tensors").read_bytes()).hexdigest()
    audit = (await api.get("/api/v1/audit")).json()["items"]
    assert "artifact.register" in {a["action"] for a in audit}


async def test_registered_artifacts_are_checked_before_anything_is_published(
    api: httpx.AsyncClient,
    settings: Settings,
    import_root: Path,
    tmp_path: Path,
    embedded_only: None,
) -> None:
    src = make_tiny_llama(tmp_path / "src")
    model_id, _ = await publish_dir(api, src, name="acme/checked")
    base = import_root / f"checked-{tmp_path.name}"
    key = bytes(range(32))
    fp16 = _write_external(src, base / "fp16", dtype=torch.float16)
    marked = _write_external(src, base / "marked", dtype=torch.bfloat16, vllm_marker=True)
    ranks = _write_external(
        src,
        base / "ranks",
        dtype=torch.float32,
        vllm_marker=True,
        names=["model-rank-000.tensors", "model-rank-001.tensors"],
        companions=False,
    )
    encrypted = _write_external(src, base / "enc", dtype=torch.float32, key=key)
    corrupt = _write_external(src, base / "corrupt", dtype=torch.float32, companions=False)
    data = bytearray((corrupt / "model.tensors").read_bytes())
    data[-100] ^= 0xFF  # one flipped bit of tensor data
    (corrupt / "model.tensors").write_bytes(bytes(data))
    b64 = base64.b64encode(key).decode()

    # One at a time: a failed artifact is history, so the next may reuse its variant.
    def body(dtype: str, fmt: str, uri: str, **extra: Any) -> dict[str, Any]:
        return {"dtype": dtype, "format": fmt, "uri": uri, **extra}

    wrong_key = base64.b64encode(bytes(32)).decode()
    cases: list[tuple[str, dict[str, Any], str | None]] = [
        ("wrong dtype", body("bfloat16", "hf", f"file://{fp16}/"), "dtype_mismatch"),
        ("no marker", body("float16", "vllm", f"file://{fp16}/"), "missing_vllm_marker"),
        ("marker as hf", body("bfloat16", "hf", f"file://{marked}/"), "unexpected_vllm_marker"),
        ("vllm", body("bfloat16", "vllm", f"file://{marked}/"), None),
        ("tp2", body("float32", "vllm", f"file://{ranks}/", tensor_parallel_size=2), None),
        ("corrupt", body("float32", "hf", f"file://{corrupt}/"), "hash_mismatch"),
        (
            "no key",
            body("float32", "hf", f"file://{encrypted}/model.tensors"),
            "encryption_key_required",
        ),
        (
            "wrong key",
            body("float32", "hf", f"file://{encrypted}/", encryption_key_b64=wrong_key),
            "decryption_failed",
        ),
    ]
    jobs = {}
    for name, body, expected in cases:
        job = await _register(api, model_id, **body)
        jobs[name] = job
        done = await wait_job(api, job["id"])
        artifact = await get_artifact(api, done["artifact_id"])
        if expected is None:
            assert done["status"] == "succeeded", (name, done)
            assert_files_match_storage(settings, artifact)
        else:
            assert done["status"] == "failed", (name, done)
            assert done["error"]["code"] == expected, (name, done["error"])
            assert artifact["status"] == "failed" and artifact["files"] == [], name
            assert not artifact_dir(settings, artifact["id"]).exists(), name

    tp2 = await get_artifact(api, jobs["tp2"]["artifact_id"])
    assert {f["path"] for f in tp2["files"]} >= {"model-rank-000.tensors", "model-rank-001.tensors"}
    assert tp2["stats"]["has_vllm_marker"] is True

    # The encrypted one with its key.
    good = await _register(
        api,
        model_id,
        dtype="float32",
        format="hf",
        uri=f"file://{encrypted}/",
        encryption_key_b64=b64,
    )
    done = await wait_job(api, good["id"])
    assert done["status"] == "succeeded", done
    artifact = await get_artifact(api, done["artifact_id"])
    assert artifact["encryption"]["enabled"] is True and artifact["encryption"]["key_id"]
    assert "encryption_key_b64" not in str(done["params"]) and b64 not in str(done)
    assert await artifact_key(settings, artifact["id"]) == key
    loaded = deserialize(artifact_dir(settings, artifact["id"]) / "model.tensors", key)
    assert loaded["lm_head.weight"].dtype == torch.float32


async def test_a_source_over_the_verify_cap_fails_the_job_and_leaves_no_workdir(
    api: httpx.AsyncClient, settings: Settings, import_root: Path, tmp_path: Path
) -> None:
    src = make_tiny_llama(tmp_path / "src")
    model_id, _ = await publish_dir(api, src, name="acme/oversized")
    external = import_root / f"big-{tmp_path.name}"
    external.mkdir()
    limit = settings.worker.verify_max_bytes
    assert limit is not None
    with (external / "model.tensors").open("wb") as f:
        f.truncate(limit + 1)  # sparse: over the cap without using the disk
    job = await _register(api, model_id, dtype="float16", format="hf", uri=f"file://{external}/")
    done = await wait_job(api, job["id"])
    assert done["status"] == "failed"
    assert done["error"]["code"] == "source_too_large"
    assert list((settings.data_dir / "work").glob(f"job-{job['id']}-*")) == []
    artifact = await get_artifact(api, done["artifact_id"])
    assert artifact["status"] != "ready"


async def test_register_refuses_bad_requests_up_front(
    api: httpx.AsyncClient, tmp_path: Path, import_root: Path, embedded_only: None
) -> None:
    model_id, _ = await publish_dir(api, make_tiny_llama(tmp_path / "src"), name="acme/refuse")
    base = {"version": 1, "dtype": "float16", "format": "hf"}
    root = f"file://{import_root}/"
    cases = [
        ({**base, "uri": "file:///etc/"}, "import_root_forbidden"),
        ({**base, "uri": "ftp://host/model.tensors"}, "invalid_source_uri"),
        ({**base, "uri": "https://host/model.bin"}, "invalid_source_uri"),
        ({**base, "uri": root, "encryption_key_b64": "c2hvcnQ="}, "invalid_encryption_key"),
        ({**base, "uri": root, "tensor_parallel_size": 2}, "unsupported_variant"),
        ({**base, "version": 7, "uri": root}, "version_not_found"),
    ]
    for body, code in cases:
        r = await api.post(f"/api/v1/models/{model_id}/artifacts", json=body)
        assert r.status_code in (404, 422), (body, r.text)
        assert r.json()["code"] == code, (body, r.json())
    assert (await api.get(f"/api/v1/models/{model_id}/artifacts")).json()["items"] == []


@pytest.mark.parametrize("scope", ["models:read"])
async def test_register_needs_write_and_tensorize_needs_tensorize(
    api: httpx.AsyncClient, tmp_path: Path, scope: str, embedded_only: None
) -> None:
    from tests.factories import auth, create_token

    model_id, _ = await publish_dir(api, make_tiny_llama(tmp_path / "src"), name="acme/scopes")
    token = await create_token(api, scopes=[scope])
    r = await api.post(
        f"/api/v1/models/{model_id}/tensorize", json={"dtype": "float16"}, headers=auth(token)
    )
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"
    r = await api.post(
        f"/api/v1/models/{model_id}/artifacts",
        json={"version": 1, "dtype": "float16", "format": "hf", "uri": "file:///x/"},
        headers=auth(token),
    )
    assert r.status_code == 403
    assert (await api.get("/api/v1/workers", headers=auth(token))).status_code == 200
    other = await create_token(api, scopes=["admin"], namespaces=["other"])
    r = await api.get(f"/api/v1/models/{model_id}/artifacts", headers=auth(other))
    assert (r.status_code, r.json()["code"]) == (404, "model_not_found")


async def test_a_link_to_the_registrys_secrets_is_refused_and_nothing_is_stored(
    api: httpx.AsyncClient, settings: Settings, import_root: Path, tmp_path: Path
) -> None:
    """The attack: a valid model.tensors beside a tokenizer.json that links to the signing key.
    Registering the directory used to copy the key into the artifact, served by signed URLs."""
    src = make_tiny_llama(tmp_path / "src")
    model_id, _ = await publish_dir(api, src, name="acme/escape")
    external = _write_external(
        src, import_root / f"escape-{tmp_path.name}", dtype=torch.float16, companions=False
    )
    settings.signing_key_bytes()  # the file exists (the worker made it on start)
    (external / "tokenizer.json").symlink_to(settings.secrets_dir / "signing.key")
    job = await _register(api, model_id, dtype="float16", format="hf", uri=f"file://{external}/")
    done = await wait_job(api, job["id"])
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "import_root_forbidden", done["error"]
    artifact = await get_artifact(api, done["artifact_id"])
    assert artifact["status"] == "failed" and artifact["files"] == []
    assert not artifact_dir(settings, artifact["id"]).exists()
    r = await api.get("/api/v1/resolve?model=acme/escape&dtype=float16&format=hf")
    assert r.status_code == 404 and r.json()["code"] == "no_matching_artifact", r.text
