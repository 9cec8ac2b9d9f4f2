"""Tensorize end to end: HTTP request → real worker process → artifact in storage, read back
with plain tensorizer and compared bit for bit with the source, and run through transformers.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import tensorizer
import torch

from harness.waiting import wait_job
from tensor_registry.formats import layout
from tensor_registry.formats.layout import LAYOUT_FILE
from tensor_registry.formats.signed_manifest import MANIFEST_FILE, SIGNATURE_FILE, verify
from tensor_registry_server.settings import Settings
from tests.hf_fixtures import make_tiny_gpt2, make_tiny_llama, minilm_dir
from tests.pipeline.helpers import (
    artifact_dir,
    artifact_key,
    assert_files_match_storage,
    deserialize,
    get_artifact,
    load_into_fresh_model,
    publish_dir,
    source_model,
    tensorize,
)
from tests.stage_hold import StageHold

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
COMPANIONS = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}


def _check_layout(directory: Path, *, key_needed: bool) -> None:
    """The published layout manifest says what tensorizer's own reader sees: names, dtypes,
    shapes, and (unencrypted) the very bytes of every tensor at its offsets; every chunk
    digest is BLAKE3 of that slice."""
    from tests.workers.layout_checks import assert_layout_matches

    manifest = layout.loads((directory / LAYOUT_FILE).read_bytes())
    (entry,) = manifest.files
    assert entry.path == "model.tensors" and entry.encrypted is key_needed
    assert_layout_matches(directory / "model.tensors", entry)


def _check_signed_manifest(settings: Settings, artifact: dict[str, Any], *, src: Path) -> None:
    """The published manifest verifies with the registry's key and says what was published:
    every other file by size and sha256, the variant (key id, never the key), the layout's
    sha256, the source version's file digests, the job and the toolchain."""
    import hashlib

    from tensor_registry_server.trust.signing_keys import manifest_keys

    directory = artifact_dir(settings, artifact["id"])
    data = (directory / MANIFEST_FILE).read_bytes()
    keys = manifest_keys(settings)
    signed = verify(data, keys.trusted())
    assert signed.key_id == keys.active_id
    assert signed.artifact_id == artifact["id"]
    others = [f for f in artifact["files"] if f["path"] != MANIFEST_FILE]
    signed.check_files([(f["path"], f["size"], f["sha256"]) for f in others], what="the row")
    predicate = signed.predicate
    assert predicate["artifact"]["encryption"] == artifact["encryption"]
    assert predicate["artifact"]["dtype"] == artifact["dtype"]
    layout_row = next(f for f in others if f["path"] == LAYOUT_FILE)
    assert predicate["layout"] == {"path": LAYOUT_FILE, "sha256": layout_row["sha256"]}
    provenance = predicate["provenance"]
    assert provenance["job_id"] == artifact["job_id"]
    assert provenance["source_version"]["number"] == artifact["version"]
    source = {f["path"]: f["sha256"] for f in provenance["source_version"]["files"]}
    for name in ("config.json", "model.safetensors"):
        if (src / name).exists():
            assert source[name] == hashlib.sha256((src / name).read_bytes()).hexdigest()
    assert provenance["toolchain"]["tensorizer"] == tensorizer.__version__
    assert provenance["toolchain"]["torch"] == torch.__version__
    assert provenance["started_at"] <= provenance["finished_at"]
    assert predicate["compatibility_key"] == artifact["stats"]["compatibility_key"]
    if artifact["encryption"]["enabled"]:
        key = json.dumps(signed.statement)
        assert "wrapped" not in key and "key_b64" not in key


def _check_model_signature(settings: Settings, artifact: dict[str, Any], tmp: Path) -> None:
    """The worker wrote model.sig: the reference verifier (model_signing's library, as its CLI
    `verify key` configures it) accepts the stored artifact's directory with the registry's
    model-signing key, and it is listed among the files with its digest."""
    import model_signing

    from tensor_registry_server.trust.signing_keys import model_signing_keys

    directory = artifact_dir(settings, artifact["id"])
    rows = {f["path"]: f["sha256"] for f in artifact["files"]}
    assert (
        rows[SIGNATURE_FILE]
        == hashlib.sha256((directory / SIGNATURE_FILE).read_bytes()).hexdigest()
    )
    pem = tmp / f"model-signing-{uuid.uuid4().hex[:8]}.pem"
    pem.write_bytes(model_signing_keys(settings).active_pem)
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pem).set_hashing_config(
        model_signing.hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE])
    ).verify(directory, directory / SIGNATURE_FILE)


async def _check_artifact(
    settings: Settings,
    artifact: dict[str, Any],
    *,
    src: Path,
    dtype: str,
    encrypted: bool,
    inputs: torch.Tensor,
    forward: str = "logits",
) -> None:
    torch_dtype = DTYPES[dtype]
    assert artifact["status"] == "ready"
    assert (artifact["dtype"], artifact["format"], artifact["tensor_parallel_size"]) == (
        dtype,
        "hf",
        1,
    )
    assert artifact["tensorizer_version"] == tensorizer.__version__
    assert artifact["encryption"]["enabled"] is encrypted
    if encrypted:
        assert artifact["encryption"]["key_id"]
        assert artifact["encryption"]["algorithm"] == "tensorizer-xsalsa20-poly1305"
    else:
        assert artifact["encryption"] == {"enabled": False, "key_id": None, "algorithm": None}
    names = {f["path"] for f in artifact["files"]}
    assert "model.tensors" in names
    assert COMPANIONS & {p.name for p in src.iterdir()} <= names
    assert_files_match_storage(settings, artifact)
    _check_layout(artifact_dir(settings, artifact["id"]), key_needed=encrypted)
    _check_signed_manifest(settings, artifact, src=src)
    _check_model_signature(settings, artifact, src.parent)
    for companion in names - {"model.tensors", LAYOUT_FILE, MANIFEST_FILE, SIGNATURE_FILE}:
        stored = (artifact_dir(settings, artifact["id"]) / companion).read_bytes()
        assert stored == (src / companion).read_bytes(), companion

    reference = source_model(src, torch_dtype)
    expected = reference.state_dict()
    tensors_path = artifact_dir(settings, artifact["id"]) / "model.tensors"
    key = await artifact_key(settings, artifact["id"]) if encrypted else None
    if encrypted:
        with pytest.raises(Exception, match=r"(?i)encrypt"):
            deserialize(tensors_path)
        with pytest.raises(Exception):  # noqa: B017 - any refusal will do, the bytes are what matters
            deserialize(tensors_path, bytes(32))
    loaded = deserialize(tensors_path, key)
    assert set(loaded) == set(expected)
    for name, tensor in loaded.items():
        assert tensor.dtype == torch_dtype, name
        assert torch.equal(tensor, expected[name]), name
    assert artifact["parameter_count"] == sum(p.numel() for p in reference.parameters())

    restored = load_into_fresh_model(src, tensors_path, torch_dtype, key)
    with torch.no_grad():
        want = getattr(reference(inputs), forward)
        got = getattr(restored(inputs), forward)
    assert got.dtype == torch_dtype
    assert torch.equal(got, want)


async def _tensorize_matrix(
    api: httpx.AsyncClient, model_id: str, dtypes: list[str]
) -> dict[tuple[str, bool], dict[str, Any]]:
    jobs = {}
    for dtype in dtypes:
        for encrypt in (False, True):
            jobs[(dtype, encrypt)] = await tensorize(
                api, model_id, dtype=dtype, format="hf", encrypt=encrypt
            )
    done = {}
    for variant, job in jobs.items():
        finished = await wait_job(api, job["id"])
        assert finished["status"] == "succeeded", finished
        assert finished["error"] is None
        assert finished["attempts"] == 1
        assert finished["progress"]["bytes_done"] == finished["progress"]["bytes_total"] > 0
        assert finished["started_at"] and finished["finished_at"]
        done[variant] = await get_artifact(api, finished["artifact_id"])
    return done


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
async def test_every_dtype_encrypted_and_not_matches_the_source_bit_for_bit(
    api: httpx.AsyncClient, settings: Settings, tmp_path: Path, architecture: str
) -> None:
    make = make_tiny_llama if architecture == "llama" else make_tiny_gpt2
    src = make(tmp_path / architecture, seed=7)
    model_id, _ = await publish_dir(api, src, name=f"acme/{architecture}")
    artifacts = await _tensorize_matrix(api, model_id, list(DTYPES))
    inputs = torch.tensor([[1, 17, 42, 99, 250, 3, 8]])
    for (dtype, encrypted), artifact in artifacts.items():
        await _check_artifact(
            settings, artifact, src=src, dtype=dtype, encrypted=encrypted, inputs=inputs
        )
    # Six variants, six distinct ready artifacts, all listed.
    r = await api.get(f"/api/v1/models/{model_id}/artifacts", params={"status": "ready"})
    assert r.status_code == 200
    assert {a["id"] for a in r.json()["items"]} == {a["id"] for a in artifacts.values()}


async def test_real_minilm_weights(
    api: httpx.AsyncClient, settings: Settings, embedded_only: None
) -> None:
    # One stack is enough for the 90 MB model.
    src = minilm_dir()
    model_id, _ = await publish_dir(api, src, name="sentence-transformers/all-minilm-l6-v2")
    job = await tensorize(api, model_id, dtype="bfloat16", format="hf", encrypt=True)
    finished = await wait_job(api, job["id"])
    assert finished["status"] == "succeeded", finished
    artifact = await get_artifact(api, finished["artifact_id"])
    assert artifact["stats"]["architecture"] == "BertModel"
    await _check_artifact(
        settings,
        artifact,
        src=src,
        dtype="bfloat16",
        encrypted=True,
        inputs=torch.tensor([[101, 7592, 2088, 102]]),
        forward="last_hidden_state",
    )


async def test_ready_variant_and_idempotency_key_return_what_exists(
    api: httpx.AsyncClient, tmp_path: Path, stage_hold: StageHold
) -> None:
    model_id, _ = await publish_dir(api, make_tiny_llama(tmp_path / "m"), name="acme/idem")
    body = {"dtype": "float16", "format": "hf"}
    # The job is held mid-serialize while the repeats are asked: a tiny model's job otherwise
    # may finish before the twin request (then 200 with the artifact, not 202 with the job).
    stage_hold.arm()
    first = await api.post(
        f"/api/v1/models/{model_id}/tensorize", json=body, headers={"Idempotency-Key": "k-1"}
    )
    assert first.status_code == 202, first.text
    await stage_hold.wait_held()
    # Same key and body: the same job. Same variant without a key: the same job too.
    again = await api.post(
        f"/api/v1/models/{model_id}/tensorize", json=body, headers={"Idempotency-Key": "k-1"}
    )
    assert again.json()["id"] == first.json()["id"]
    twin = await api.post(f"/api/v1/models/{model_id}/tensorize", json=body)
    assert twin.status_code == 202 and twin.json()["id"] == first.json()["id"]
    # Same key, different body: refused, nothing created.
    other = await api.post(
        f"/api/v1/models/{model_id}/tensorize",
        json={"dtype": "float32", "format": "hf"},
        headers={"Idempotency-Key": "k-1"},
    )
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused"

    stage_hold.release()
    finished = await wait_job(api, first.json()["id"])
    assert finished["status"] == "succeeded"
    # Once ready: 200 with the artifact itself.
    ready = await api.post(f"/api/v1/models/{model_id}/tensorize", json=body)
    assert ready.status_code == 200
    assert ready.json()["id"] == finished["artifact_id"]
    assert ready.json()["status"] == "ready"
    replay = await api.post(
        f"/api/v1/models/{model_id}/tensorize", json=body, headers={"Idempotency-Key": "k-1"}
    )
    assert replay.status_code == 200
    assert replay.json()["id"] == first.json()["id"] and replay.json()["status"] == "succeeded"
    r = await api.get(f"/api/v1/models/{model_id}/artifacts")
    assert len(r.json()["items"]) == 1


async def test_jobs_no_live_worker_can_run_are_refused(
    api: httpx.AsyncClient, live_worker: dict[str, Any], tmp_path: Path
) -> None:
    assert live_worker["live"] is True
    caps = live_worker["capabilities"]
    assert caps["versions"]["tensorizer"] == tensorizer.__version__
    assert caps["versions"]["torch"] == torch.__version__
    assert caps["cpu"]["memory_total"] > 0 and caps["encryption"] is True
    assert caps["cuda"]["device_count"] == 0 and caps["versions"]["vllm"] is None
    model_id, _ = await publish_dir(api, make_tiny_llama(tmp_path / "m"), name="acme/refused")
    r = await api.post(
        f"/api/v1/models/{model_id}/tensorize", json={"dtype": "bfloat16", "format": "vllm"}
    )
    assert r.status_code == 409
    assert r.json()["code"] == "no_capable_worker"
    assert "vLLM" in r.json()["missing"][0]
    r = await api.post(
        f"/api/v1/models/{model_id}/tensorize",
        json={"dtype": "bfloat16", "format": "hf", "tensor_parallel_size": 2},
    )
    assert r.status_code == 422 and r.json()["code"] == "unsupported_variant"
    r = await api.post(
        f"/api/v1/models/{model_id}/tensorize", json={"dtype": "int8", "format": "hf"}
    )
    assert r.status_code == 422 and r.json()["code"] == "validation_error"
    r = await api.post(
        f"/api/v1/models/{model_id}/tensorize", json={"dtype": "float16", "version": 9}
    )
    assert r.status_code == 404 and r.json()["code"] == "version_not_found"
    # Nothing was created by any of these.
    assert (await api.get(f"/api/v1/models/{model_id}/artifacts")).json()["items"] == []
    jobs = (await api.get("/api/v1/jobs", params={"model_id": model_id})).json()["items"]
    assert jobs == []


def _sse_jobs(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix("data: "))
        for line in text.splitlines()
        if line.startswith("data: ")
    ]


def _assert_progress_never_goes_back(events: list[dict[str, Any]]) -> None:
    """Each stage counts its own bytes (download, then serialize from 0 again): within a stage
    the count never goes back; the stream ends on the final state, every byte counted."""
    assert events[-1]["status"] == "succeeded"
    assert events[-1]["progress"]["bytes_done"] == events[-1]["progress"]["bytes_total"] > 0
    seen = [(e["progress"]["stage"], e["progress"]["bytes_done"]) for e in events]
    for (stage, done), (next_stage, next_done) in itertools.pairwise(seen):
        assert next_stage != stage or next_done >= done, seen


async def test_events_stream_progress_until_the_job_ends(
    api: httpx.AsyncClient, app: Any, settings: Settings, tmp_path: Path, stage_hold: StageHold
) -> None:
    """The route's stream (read whole: the in-process transport buffers it) ends on the final
    state; the same stream read while the job is held mid-serialize shows that stage live
    and follows the job to its end (an unheld tiny job can serialize between two polls)."""
    from tensor_registry_server.jobs import events
    from tensor_registry_server.jobs.router import to_out

    model_id, _ = await publish_dir(api, make_tiny_gpt2(tmp_path / "m"), name="acme/events")
    stage_hold.arm()
    job = await tensorize(api, model_id, dtype="float32", format="hf")
    whole = asyncio.create_task(api.get(f"/api/v1/jobs/{job['id']}/events"))
    await stage_hold.wait_held()
    live = events.job_events(
        app.state.sessionmaker,
        settings,
        uuid.UUID(job["id"]),
        lambda row: to_out(row, None).model_dump_json(),
    )
    [first] = _sse_jobs(await anext(live))
    assert first["status"] == "running" and first["progress"]["stage"] == "serialize", first
    stage_hold.release()
    followed = [first, *_sse_jobs("".join([chunk async for chunk in live]))]
    assert len(followed) >= 2
    _assert_progress_never_goes_back(followed)

    stream = await asyncio.wait_for(whole, timeout=120)
    assert stream.status_code == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    _assert_progress_never_goes_back(_sse_jobs(stream.text))


async def test_deleting_an_artifact_removes_its_bytes(
    api: httpx.AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    model_id, _ = await publish_dir(api, make_tiny_llama(tmp_path / "m"), name="acme/delete")
    job = await wait_job(api, (await tensorize(api, model_id, dtype="float16"))["id"])
    artifact_id = job["artifact_id"]
    assert (artifact_dir(settings, artifact_id) / "model.tensors").is_file()
    r = await api.delete(f"/api/v1/artifacts/{artifact_id}")
    assert r.status_code == 204
    assert (await api.get(f"/api/v1/artifacts/{artifact_id}")).status_code == 404
    assert not artifact_dir(settings, artifact_id).exists()
    audit = (await api.get("/api/v1/audit")).json()["items"]
    actions = {a["action"] for a in audit}
    assert {"tensorize.request", "artifact.delete"} <= actions


async def test_import_job_runs_on_the_worker_and_the_version_tensorizes(
    api: httpx.AsyncClient, import_root: Path, tmp_path: Path
) -> None:
    src = make_tiny_llama(import_root / f"import-{tmp_path.name}")
    r = await api.post("/api/v1/models", json={"name": "acme/imported"})
    model_id = r.json()["id"]
    r = await api.post(f"/api/v1/models/{model_id}/versions", json={"source_uri": f"file://{src}/"})
    assert r.status_code == 202, r.text
    job_id = r.headers["location"].rsplit("/", 1)[1]
    done = await wait_job(api, job_id)
    assert done["status"] == "succeeded", done
    assert done["kind"] == "import"
    version = (await api.get(f"/api/v1/models/{model_id}/versions/1")).json()
    assert version["status"] == "ready"
    assert {f["path"] for f in version["files"]} >= {"config.json", "model.safetensors"}
    job = await tensorize(api, model_id, dtype="bfloat16")
    assert (await wait_job(api, job["id"]))["status"] == "succeeded"


async def test_resolve_sees_a_newly_published_artifact_at_once(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    # Scaled stack: the API caches resolve choices in Redis; the worker's publish must drop them.
    model_id, _ = await publish_dir(api, make_tiny_gpt2(tmp_path / "m"), name="acme/fresh")
    first = await wait_job(api, (await tensorize(api, model_id, dtype="float32"))["id"])
    for _ in range(3):  # warm the cache (the first sight of a question never fills it)
        r = await api.get("/api/v1/resolve", params={"model": "acme/fresh"})
        assert r.json()["artifact"]["id"] == first["artifact_id"]
    second = await wait_job(api, (await tensorize(api, model_id, dtype="float16"))["id"])
    r = await api.get("/api/v1/resolve", params={"model": "acme/fresh"})
    assert r.status_code == 200
    assert r.json()["artifact"]["id"] == second["artifact_id"]  # newest wins, no stale choice
