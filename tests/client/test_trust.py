"""Signed manifests against a real `tensor-registry serve` and its worker: publish → tensorize →
resolve → verify → load/pull with the signature checked; every tamper case failing with its
code and nothing loaded; the node cache reusing an object only for its compatibility key;
export → import into a second registry; key rotation (tests/client/test_trust_rotation.py)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from harness.artifacts import MadeArtifact, make_artifact, replace_artifact_file
from harness.serve_process import ServeProcess, free_port
from harness.waiting import wait_job, wait_job_sync, wait_live_worker
from tensor_registry import RegistryClient
from tensor_registry.cli.output import format_size
from tensor_registry.engine import load_artifact
from tensor_registry.formats.layout import LAYOUT_FILE
from tensor_registry.formats.model_signature import KEYS_FILE
from tensor_registry.formats.signed_manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    ManifestFile,
    statement,
)
from tensor_registry.node_cache import NodeCache
from tensor_registry.trust import TrustError, check_model_signature, verify_resolution
from tensor_registry_server.trust.signing_keys import (
    ManifestKeys,
    manifest_keys,
    model_signing_keys,
)
from tests.client.conftest import Registry
from tests.hf_fixtures import make_tiny_gpt2
from tests.pipeline.helpers import deserialize, publish_dir, tensorize


@pytest.fixture(autouse=True)
def client_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test pins keys in its own client config dir."""
    path = tmp_path / "client-config"
    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(path))
    monkeypatch.delenv("TENSOR_REGISTRY_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("TENSOR_REGISTRY_REQUIRE_SIGNED", raising=False)
    return path


@pytest.fixture(scope="module")
def imports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("imports")


@pytest.fixture(scope="module")
def second(
    tmp_path_factory: pytest.TempPathFactory, imports: Path, registry: Registry
) -> Iterator[Registry]:
    """A second registry with its own data dir, port and key, and a worker: it tensorizes, and
    it imports bundles from ``imports`` (its storage.import_roots) signed by ``registry``
    (whose public key it lists in security.trusted_manifest_keys)."""
    from tensor_registry_server.settings import Settings
    from tests.client.conftest import TOKEN

    first = manifest_keys(registry.settings).public[0].public_key

    data_dir = tmp_path_factory.mktemp("second") / "data"
    server = ServeProcess(
        data_dir=data_dir,
        port=free_port(),
        worker=True,
        env={
            "TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN,
            "TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS": json.dumps([str(imports)]),
            "TENSOR_REGISTRY_WORKER__HEARTBEAT_SECONDS": "1",
            "TENSOR_REGISTRY_SECURITY__TRUSTED_MANIFEST_KEYS": json.dumps(
                [base64.b64encode(first).decode()]
            ),
        },
    ).start()
    try:
        settings = Settings(
            data_dir=data_dir,
            database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
            storage={},  # type: ignore[arg-type]
            security={},  # type: ignore[arg-type]
        )
        yield Registry(
            server=server,
            token=TOKEN,
            settings=settings,
            config_home=tmp_path_factory.mktemp("xdg-config-second"),
        )
    finally:
        server.stop()


def oms_verify(directory: Path, public_key: Path) -> subprocess.CompletedProcess[str]:
    """The reference OpenSSF Model Signing verifier, default options."""
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "model_signing"),
            *("verify", "key", "--signature", str(directory / SIGNATURE_FILE)),
            *("--public_key", str(public_key), str(directory)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _name() -> str:
    return f"acme/t-{uuid.uuid4().hex[:10]}"


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(300, 257, generator=g), "b.bias": torch.randn(33, generator=g)}


async def signed_artifact(
    registry: Registry,
    *,
    seed: int = 0,
    name: str | None = None,
    state: dict[str, torch.Tensor] | torch.nn.Module | None = None,
) -> tuple[str, MadeArtifact]:
    """A factory artifact given its layout, signed manifest and model.sig by the backfill
    functions."""
    from tensor_registry_server.artifacts.making.signatures import (
        backfill_manifest,
        backfill_model_signature,
    )
    from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
    from tensor_registry_server.storage.registry import StorageRegistry

    name = name or _name()
    registry.ready_model(name)
    source = state if state is not None else _state(seed)
    made = await make_artifact(
        registry.settings, model=name, version=1, sources=[source], layout=True
    )
    storages = StorageRegistry(registry.settings)
    engine = create_engine(registry.settings.database_url)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            assert await backfill_manifest(
                session, registry.settings, storages.get("local"), made.id
            )
        async with session_scope(make_sessionmaker(engine)) as session:
            assert await backfill_model_signature(
                session, registry.settings, storages.get("local"), made.id
            )
    finally:
        await engine.dispose()
        await storages.close()
    for path in (MANIFEST_FILE, SIGNATURE_FILE):
        made.files[path] = (made.directory / path).read_bytes()
    return name, made


async def replace_file(registry: Registry, made: MadeArtifact, path: str, data: bytes) -> None:
    """Storage AND the file row changed: what an attacker with write access to both (but not
    the signing key) can do. Only the signature can catch it."""
    await replace_artifact_file(registry.settings.database_url, made, path, data)


def _client(registry: Registry) -> RegistryClient:
    return RegistryClient(registry.url, registry.token)


def _payload(envelope: bytes) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(json.loads(envelope)["payload"])))


async def test_publish_tensorize_resolve_verify_load_and_pull_with_signatures_checked(
    second: Registry, tmp_path: Path, client_config: Path
) -> None:
    registry = second
    src = make_tiny_gpt2(tmp_path / "src", seed=3)
    name = _name()
    async with httpx.AsyncClient(
        base_url=registry.url, headers={"Authorization": f"Bearer {registry.token}"}, timeout=60
    ) as api:
        model_id, _ = await publish_dir(api, src, name=name)
        await wait_live_worker(api)
        job = await tensorize(api, model_id, dtype="float32", format="hf")
        done = await wait_job(api, job["id"], timeout=300)
    assert done["status"] == "succeeded", done
    active = manifest_keys(registry.settings).active_id

    with _client(registry) as client:
        answer = client.resolve(name)
        assert answer.data["manifest_path"] == MANIFEST_FILE
        assert answer.data["compatibility_key"].startswith("sha256:")
        kinds = {f.path: f.kind for f in answer.files}
        assert kinds[MANIFEST_FILE] == "manifest" and kinds[LAYOUT_FILE] == "layout"
        assert kinds[SIGNATURE_FILE] == "signature"  # the worker wrote model.sig too
        signed = verify_resolution(client, answer)
        assert signed is not None and signed.key_id == active
        assert signed.artifact_id == done["artifact_id"]
        assert signed.compatibility_key == answer.data["compatibility_key"]
        provenance = signed.predicate["provenance"]
        assert provenance["job_id"] == job["id"] and provenance["toolchain"]["torch"]
        result = load_artifact(answer, client=client, cache=NodeCache(tmp_path / "cache"))
    assert (result.path, result.signed_by) == ("engine", active)
    root = registry.settings.local_storage_root
    stored = deserialize(root / "artifacts" / done["artifact_id"] / "model.tensors")
    assert set(result.tensors) == set(stored)
    for key, tensor in stored.items():
        assert torch.equal(result.tensors[key], tensor), key
    # Trust on first use pinned the registry's key.
    pins = json.loads((client_config / "trusted-keys.json").read_text())
    assert list(pins["registries"][manifest_keys(registry.settings).registry_id]["keys"]) == [
        active
    ]

    env = {
        "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"),
        "TENSOR_REGISTRY_CONFIG_DIR": str(client_config),
    }
    dest = tmp_path / "pulled"
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert f"signed manifest verified (key {active[:16]})" in pulled.stderr
    assert (dest / MANIFEST_FILE).is_file()
    checked = registry.cli("verify", str(dest), env=env)
    assert checked.returncode == 0, checked.stderr
    summary = json.loads(checked.stdout)
    assert (summary["artifact"], summary["signed_by"]) == (done["artifact_id"], active)
    # The pulled directory is what the reference verifier accepts, with the served key.
    pem = tmp_path / "model-signing.pem"
    pem.write_bytes(
        httpx.get(registry.url + "/.well-known/tensor-registry/model-signing.pem").content
    )
    assert pem.read_bytes() == model_signing_keys(registry.settings).active_pem
    accepted = oms_verify(dest, pem)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    online = registry.cli("verify", f"{name}:1", env=env)
    assert online.returncode == 0, online.stderr

    # A tampered pulled copy fails offline (the files are hard links: replace, not edit).
    config = dest / "config.json"
    data = config.read_bytes()
    config.unlink()
    config.write_bytes(data.replace(b"}", b', "n_layer": 99}', 1))
    bad = registry.cli("verify", str(dest), env=env)
    assert bad.returncode == 1 and "content_mismatch" in bad.stderr and "config.json" in bad.stderr
    # ...and a copy verified with keys that are not the registry's fails too.
    stranger = base64.b64encode(os.urandom(32)).decode()
    config.unlink()
    config.write_bytes(data)
    other = registry.cli("verify", str(dest), "--trusted-key", stranger, env=env)
    assert other.returncode == 1 and "untrusted_signing_key" in other.stderr


def _resign(keys: ManifestKeys, envelope: bytes, **changes: Any) -> bytes:
    body = _payload(envelope)
    body["predicate"].update(changes)
    files = [ManifestFile(f["path"], f["size"], f["sha256"]) for f in body["predicate"]["files"]]
    predicate = {k: v for k, v in body["predicate"].items() if k != "files"}
    return keys.sign(statement(files=files, predicate=predicate))


def _stranger_keys() -> ManifestKeys:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return ManifestKeys(Ed25519PrivateKey.generate(), [], [])


async def _refused(registry: Registry, name: str, cache_dir: Path) -> TrustError:
    with _client(registry) as client, pytest.raises(TrustError) as caught:
        load_artifact(name, client=client, cache=NodeCache(cache_dir))
    return caught.value


async def test_every_tampered_manifest_or_file_fails_and_loads_nothing(
    registry: Registry, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    # Signed by a key the registry never published.
    name, made = await signed_artifact(registry, seed=1)
    forged = _resign(_stranger_keys(), made.files[MANIFEST_FILE])
    await replace_file(registry, made, MANIFEST_FILE, forged)
    error = await _refused(registry, name, cache_dir)
    assert error.code == "untrusted_signing_key", error
    # `pull` refuses before it places a single file.
    dest = tmp_path / "pulled"
    env = {
        "TENSOR_REGISTRY_CACHE_DIR": str(cache_dir),
        "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=env)
    assert pulled.returncode == 1 and "untrusted_signing_key" in pulled.stderr
    assert list(dest.iterdir()) == [] and not (cache_dir / "objects").exists()

    # A valid manifest, signed by the registry, but for another artifact.
    _, made_a = await signed_artifact(registry, seed=2)
    name_b, made_b = await signed_artifact(registry, seed=3)
    await replace_file(registry, made_b, MANIFEST_FILE, made_a.files[MANIFEST_FILE])
    error = await _refused(registry, name_b, cache_dir)
    assert error.code == "manifest_mismatch" and str(made_a.id) in str(error), error

    # The signed payload edited after signing (the signature kept).
    name, made = await signed_artifact(registry, seed=4)
    raw = json.loads(made.files[MANIFEST_FILE])
    body = _payload(made.files[MANIFEST_FILE])
    body["predicate"]["artifact"]["dtype"] = "float16"
    raw["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    await replace_file(registry, made, MANIFEST_FILE, json.dumps(raw).encode())
    error = await _refused(registry, name, cache_dir)
    assert error.code == "signature_invalid", error

    # Other weights in storage with a row to match: the signed sha256 no longer agrees.
    name, made = await signed_artifact(registry, seed=5)
    from harness.artifacts import write_tensors

    other = tmp_path / "other.tensors"
    write_tensors(other, _state(99))
    await replace_file(registry, made, "model.tensors", other.read_bytes())
    error = await _refused(registry, name, cache_dir)
    assert error.code == "content_mismatch" and "model.tensors" in str(error), error
    # The CLI says the same, with the code, and exits 1.
    done = registry.cli("load", name, env=env)
    assert done.returncode == 1 and "content_mismatch" in done.stderr and not done.stdout


def _module(seed: int) -> torch.nn.Module:
    """A module whose state is ``_state(seed)``'s shapes: a.weight, b.bias."""
    module = torch.nn.Module()
    module.a = torch.nn.Linear(257, 300, bias=False)
    module.b = torch.nn.Module()
    module.b.bias = torch.nn.Parameter(torch.empty(33))
    with torch.no_grad():
        for name, value in _state(seed).items():
            module.get_parameter(name).copy_(value)
    return module


def _cached(cache: NodeCache) -> set[str]:
    return {e.sha256 for e in cache.entries()}


async def _swap_served_weights(made: MadeArtifact, tmp_path: Path, source: Any) -> None:
    """Other weights in storage under the signed URL; the file row and the manifest unchanged.
    A well-formed tensorizer file of the same size whose own per-tensor hashes all match."""
    from harness.artifacts import write_tensors

    forged = tmp_path / f"forged-{uuid.uuid4().hex[:8]}.tensors"
    write_tensors(forged, source)
    served = made.directory / "model.tensors"
    assert forged.stat().st_size == served.stat().st_size
    served.unlink()
    served.write_bytes(forged.read_bytes())


async def test_load_state_dict_checks_the_bytes_at_the_signed_url_and_loads_nothing_else(
    registry: Registry, tmp_path: Path
) -> None:
    from tensorizer import TensorDeserializer

    from tensor_registry import load_into_module, load_state_dict
    from tensor_registry.api.client import ChecksumMismatch

    cache = NodeCache(tmp_path / "cache")
    name, _ = await signed_artifact(registry, seed=20)
    with _client(registry) as client:
        loaded = load_state_dict(name, client=client, cache=cache)
    assert all(torch.equal(loaded[k], v) for k, v in _state(20).items())
    kept = _cached(cache)

    name, made = await signed_artifact(registry, seed=21)
    await _swap_served_weights(made, tmp_path, _state(98))
    with _client(registry) as client:
        answer = client.resolve(name)
        # The attack is real: tensorizer's own checks accept these bytes.
        with TensorDeserializer(answer.tensorizer_uri, device="cpu", verify_hash=True) as plain:
            assert torch.equal(plain["a.weight"], _state(98)["a.weight"])
        with pytest.raises(ChecksumMismatch) as caught:
            load_state_dict(answer, client=client, cache=cache)
    message = str(caught.value)
    assert str(made.id) in message and "model.tensors" in message, message
    assert "nothing was loaded" in message
    assert _cached(cache) == kept and not any((cache.root / "tmp").iterdir())

    # load_into_module: the module keeps its own parameters.
    name, made = await signed_artifact(registry, state=_module(22))
    await _swap_served_weights(made, tmp_path, _module(97))
    target = _module(0)
    with _client(registry) as client, pytest.raises(ChecksumMismatch):
        load_into_module(target, name, client=client, cache=cache)
    assert all(torch.equal(target.get_parameter(k), v) for k, v in _state(0).items())
    assert _cached(cache) == kept


async def test_load_state_dict_refuses_a_foreign_key_or_another_artifacts_manifest(
    registry: Registry, tmp_path: Path
) -> None:
    from tensor_registry import load_state_dict

    cache = NodeCache(tmp_path / "cache")

    def refused(name: str) -> TrustError:
        with _client(registry) as client, pytest.raises(TrustError) as caught:
            load_state_dict(name, client=client, cache=cache)
        assert _cached(cache) == set(), "nothing may be fetched before the manifest verifies"
        return caught.value

    # Signed by a key the registry never published (the client pinned the registry's).
    name, made = await signed_artifact(registry, seed=23)
    await replace_file(
        registry, made, MANIFEST_FILE, _resign(_stranger_keys(), made.files[MANIFEST_FILE])
    )
    assert refused(name).code == "untrusted_signing_key"
    # ...also when the caller names the keys it trusts.
    ours = base64.b64encode(manifest_keys(registry.settings).public[0].public_key).decode()
    with _client(registry) as client, pytest.raises(TrustError) as caught:
        load_state_dict(name, client=client, cache=cache, trusted_keys=[ours])
    assert caught.value.code == "untrusted_signing_key"

    # A manifest the registry signed, but for another artifact.
    _, made_a = await signed_artifact(registry, seed=24)
    name_b, made_b = await signed_artifact(registry, seed=25)
    await replace_file(registry, made_b, MANIFEST_FILE, made_a.files[MANIFEST_FILE])
    error = refused(name_b)
    assert error.code == "manifest_mismatch" and str(made_a.id) in str(error), error


async def test_unsigned_artifacts_load_only_when_signatures_are_not_required(
    registry: Registry, tmp_path: Path
) -> None:
    name = _name()
    registry.ready_model(name)
    state = _state(7)
    await make_artifact(registry.settings, model=name, version=1, sources=[state], layout=True)
    with _client(registry) as client:
        result = load_artifact(name, client=client, cache=NodeCache(tmp_path / "c"))
        assert result.signed_by is None
        assert torch.equal(result.tensors["a.weight"], state["a.weight"])
        with pytest.raises(TrustError) as caught:
            load_artifact(name, client=client, require_signed=True)
    assert caught.value.code == "unsigned_artifact"


async def test_a_cached_object_is_reused_only_for_its_compatibility_key(
    registry: Registry, tmp_path: Path
) -> None:
    name, made = await signed_artifact(registry, seed=8)
    env = {
        "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"),
        "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    size = len(made.files["model.tensors"])

    def pull(dest: str) -> str:
        done = registry.cli("pull", name, "--dest", str(tmp_path / dest), "--weights", env=env)
        assert done.returncode == 0, done.stderr
        return done.stderr

    first = pull("one")
    assert " 0 B from the node cache" in first
    second = pull("two")
    assert " 0 B downloaded" in second
    cache = NodeCache(tmp_path / "cache")
    sha = made.sha256("model.tensors")
    with _client(registry) as client:
        key = client.resolve(name).data["compatibility_key"]
    assert cache.compatibility_keys(sha) == {key}
    # The same bytes recorded for another compatibility key: fetched again (fail closed).
    record = tmp_path / "cache" / "compat" / sha[:2] / sha
    record.write_text("sha256:" + "0" * 64 + "\n")
    assert not cache.contains(sha, size, compatibility_key=key)
    third = pull("three")
    assert f"{format_size(size)} downloaded" in third
    assert cache.compatibility_keys(sha) == {key, "sha256:" + "0" * 64}


async def test_export_then_import_into_a_second_registry_verifies_and_resolves(
    registry: Registry, second: Registry, imports: Path, tmp_path: Path
) -> None:
    # The tensor of ready_model's source checkpoint too: the importing worker checks names.
    state = {"weight": torch.arange(16, dtype=torch.float32), **_state(9)}
    name, made = await signed_artifact(registry, state=state)
    env = {
        "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"),
        "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    bundle = imports / "bundle"
    exported = registry.cli("export", f"{name}:1", "--to", str(bundle), env=env)
    assert exported.returncode == 0, exported.stderr
    assert {MANIFEST_FILE, SIGNATURE_FILE, LAYOUT_FILE, "model.tensors"} <= {
        p.name for p in bundle.iterdir()
    }
    # The keys document goes into the node state directory, never beside the files.
    assert (bundle / KEYS_FILE).is_file() and not (bundle / "keys.json").exists()
    # The exported bundle (its keys document with it) is what the reference verifier accepts.
    pem = tmp_path / "first.pem"
    pem.write_bytes(model_signing_keys(registry.settings).active_pem)
    accepted = oms_verify(bundle, pem)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr

    from tests.client.conftest import TOKEN

    # The same source version, published in the second region first.
    target = second.ready_model(name)
    # No trusted key: refused before anything is registered.
    refused = second.cli("import", str(bundle), "--model", name, env=env)
    assert refused.returncode == 1 and "untrusted_signing_key" in refused.stderr
    # A bundle with a tampered file: refused too.
    tampered = imports / "tampered"
    shutil.copytree(bundle, tampered)
    weights = tampered / "model.tensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.unlink()
    weights.write_bytes(bytes(data))
    bad = second.cli(
        "import",
        str(tampered),
        "--model",
        name,
        "--trusted-key",
        str(bundle / KEYS_FILE),
        env=env,
    )
    assert bad.returncode == 1 and "content_mismatch" in bad.stderr
    with second.http() as http:
        listed = http.get(f"/api/v1/models/{target['id']}/artifacts").json()
        assert listed["items"] == []
        # The server checks too: a bundle signed by a key it does not trust, registered
        # straight through the API (no client-side check), fails its job with the code.
        forged = imports / "forged"
        shutil.copytree(bundle, forged)
        (forged / MANIFEST_FILE).write_bytes(
            _resign(_stranger_keys(), (bundle / MANIFEST_FILE).read_bytes())
        )
        r = http.post(
            f"/api/v1/models/{target['id']}/artifacts",
            json={"version": 1, "dtype": "float32", "format": "hf", "uri": forged.as_uri() + "/"},
        )
        assert r.status_code == 202, r.text
        job = wait_job_sync(http, r.json()["id"])
        assert job["status"] == "failed" and job["error"]["code"] == "untrusted_signing_key", job

    done = second.cli(
        "import",
        str(bundle),
        "--model",
        name,
        "--trusted-key",
        str(bundle / KEYS_FILE),
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stdout)
    assert imported["from"] == str(made.id)
    with RegistryClient(second.url, TOKEN) as client:
        answer = client.resolve(name)
        assert answer.artifact_id == imported["imported"]
        signed = verify_resolution(client, answer)  # the second registry's own signature
        assert signed is not None
        # ...and its own model.sig, by its own model-signing key (not the bundle's).
        oms = check_model_signature(client, answer, manifest_keys(second.settings).trusted())
        assert oms is not None
        assert oms.key_hint == model_signing_keys(second.settings).active_hint
        assert oms.key_hint != model_signing_keys(registry.settings).active_hint
        second_key = client.anonymous.get(second.url + "/.well-known/tensor-registry/keys")
        assert (
            signed.key_id
            == second_key.json()["active"]
            != manifest_keys(registry.settings).active_id
        )
        weights_entry = next(f for f in answer.files if f.path == "model.tensors")
        assert weights_entry.sha256 == made.sha256("model.tensors")
        provenance = signed.predicate["provenance"]
        assert provenance["source_uri"] == bundle.as_uri() + "/"
        assert provenance["imported_from"]["artifact_id"] == str(made.id)
        first = manifest_keys(registry.settings).active_id
        assert provenance["imported_from"]["key_id"] == first
        result = load_artifact(answer, client=client, cache=NodeCache(tmp_path / "c2"))
        assert torch.equal(result.tensors["a.weight"], state["a.weight"])

    # Air-gapped: the bundle verified and loaded from the directory alone.
    offline = registry.cli(
        "load-dir", str(bundle), "--trusted-key", str(bundle / KEYS_FILE), env=env
    )
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["tensors"] == 3
    offline_bad = registry.cli(
        "load-dir", str(tampered), "--trusted-key", str(bundle / KEYS_FILE), env=env
    )
    assert offline_bad.returncode == 1 and "chunk_mismatch" in offline_bad.stderr
