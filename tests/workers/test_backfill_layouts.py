"""`tensor-registry backfill-layouts`: artifacts published before layout and signed manifests
get both.

The command is run as the operator runs it (a subprocess on the server's settings, SQLite and
PostgreSQL); afterwards resolve lists the `layout` file, the manifest matches what tensorizer's
reader sees, the signed manifest verifies with the registry's published key over the artifact's
files (the layout among them), and the load engine reads the artifact through it instead of
falling back."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import torch

from harness.artifacts import make_artifact, replace_artifact_file
from harness.serve_process import ROOT
from tensor_registry import RegistryClient
from tensor_registry.engine import load_artifact
from tensor_registry.formats import layout, model_signature
from tensor_registry.formats.layout import LAYOUT_FILE
from tensor_registry.formats.signed_manifest import MANIFEST_FILE, SIGNATURE_FILE
from tensor_registry.formats.signed_manifest import verify as verify_manifest
from tensor_registry.node_cache import NodeCache
from tensor_registry.trust import keys_from_document, model_signing_keys_from_document
from tensor_registry_server.settings import Settings
from tests.client.conftest import Registry, cache_dir, registry  # noqa: F401 (fixtures)
from tests.factories import create_model, ready_version
from tests.workers.layout_checks import assert_layout_matches


def _backfill(
    data_dir: Path, *args: str, database_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    if database_url is not None:
        env["TENSOR_REGISTRY_DATABASE__URL"] = database_url
    command = [sys.executable, "-m", "tensor_registry.cli", "backfill-layouts"]
    return subprocess.run(
        [*command, "--data-dir", str(data_dir), *args],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
    )


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(512, 700, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(700, generator=g),
        "position_ids": torch.arange(33),
    }


async def _kinds(client: httpx.AsyncClient, name: str) -> dict[str, str]:
    r = await client.get("/api/v1/resolve", params={"model": name})
    assert r.status_code == 200, r.text
    return {f["path"]: f["kind"] for f in r.json()["files"]}


async def test_backfill_command_writes_missing_manifests_only(
    client: httpx.AsyncClient, settings: Settings, database_url: str
) -> None:
    old = await create_model(client, name="acme/old")
    other = await create_model(client, name="acme/other")
    for model in (old, other):
        await ready_version(client, model["id"])
    made = await make_artifact(settings, model="acme/old", version=1, sources=[_state(1)])
    await make_artifact(settings, model="acme/other", version=1, sources=[_state(2)])
    assert not {LAYOUT_FILE, MANIFEST_FILE} & set(await _kinds(client, "acme/old"))

    bad = _backfill(settings.data_dir, "--model", "not-a-name", database_url=database_url)
    assert bad.returncode == 2 and "NAMESPACE/NAME" in bad.stderr

    done = _backfill(settings.data_dir, "--model", "acme/old", database_url=database_url)
    assert done.returncode == 0, done.stderr
    assert "layout manifests added: 1, signed manifests added: 1, failed: 0" in done.stdout
    assert "model signatures added: 1" in done.stdout
    assert f"artifact {made.id}: manifest added" in done.stderr
    assert f"artifact {made.id}: signed manifest added" in done.stderr
    assert f"artifact {made.id}: model.sig added" in done.stderr
    kinds = await _kinds(client, "acme/old")
    assert (kinds[LAYOUT_FILE], kinds[MANIFEST_FILE]) == ("layout", "manifest")
    assert kinds[SIGNATURE_FILE] == "signature"
    assert not {LAYOUT_FILE, MANIFEST_FILE} & set(await _kinds(client, "acme/other"))  # --model
    manifest = layout.loads((made.directory / LAYOUT_FILE).read_bytes())
    assert_layout_matches(made.directory / "model.tensors", manifest.file("model.tensors"))
    published = await client.get("/.well-known/tensor-registry/keys")
    assert published.status_code == 200, published.text
    signed = verify_manifest(
        (made.directory / MANIFEST_FILE).read_bytes(), keys_from_document(published.json())
    )
    on_disk = [
        (p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in made.directory.iterdir()
    ]
    signed.check_files(on_disk, what="the stored artifact")  # the layout is covered too
    assert LAYOUT_FILE in signed.files and signed.predicate["provenance"]["backfilled"] is True
    # model.sig, third, covers every other file: the signed manifest too.
    oms = model_signature.verify(
        (made.directory / SIGNATURE_FILE).read_bytes(),
        model_signing_keys_from_document(published.json(), keys_from_document(published.json())),
    )
    assert oms.files == {name: sha for name, _, sha in on_disk if name != SIGNATURE_FILE}
    assert MANIFEST_FILE in oms.files

    again = _backfill(settings.data_dir, database_url=database_url)  # every model now
    assert again.returncode == 0, again.stderr
    assert "layout manifests added: 1, signed manifests added: 1, failed: 0" in again.stdout
    kinds = await _kinds(client, "acme/other")  # acme/other only
    assert (kinds[LAYOUT_FILE], kinds[MANIFEST_FILE]) == ("layout", "manifest")
    manifest_bytes = (made.directory / MANIFEST_FILE).read_bytes()
    nothing = _backfill(settings.data_dir, database_url=database_url)
    assert "0 ready artifact(s) without a layout or signed manifest" in nothing.stderr
    assert "layout manifests added: 0, signed manifests added: 0, failed: 0" in nothing.stdout
    assert "model signatures added: 0" in nothing.stdout
    assert (made.directory / MANIFEST_FILE).read_bytes() == manifest_bytes  # not re-signed


async def test_an_artifact_with_a_layout_but_no_signed_manifest_gets_only_the_manifest(
    client: httpx.AsyncClient, settings: Settings, database_url: str
) -> None:
    model = await create_model(client, name="acme/half")
    await ready_version(client, model["id"])
    made = await make_artifact(
        settings, model="acme/half", version=1, sources=[_state(6)], layout=True
    )
    layout_bytes = (made.directory / LAYOUT_FILE).read_bytes()
    assert MANIFEST_FILE not in await _kinds(client, "acme/half")
    done = _backfill(settings.data_dir, database_url=database_url)
    assert done.returncode == 0, done.stderr
    assert "layout manifests added: 0, signed manifests added: 1, failed: 0" in done.stdout
    assert (await _kinds(client, "acme/half"))[MANIFEST_FILE] == "manifest"
    assert (made.directory / LAYOUT_FILE).read_bytes() == layout_bytes


async def test_a_failing_artifact_is_reported_and_the_others_still_get_theirs(
    client: httpx.AsyncClient, settings: Settings, database_url: str
) -> None:
    for name in ("acme/gone", "acme/kept"):
        model = await create_model(client, name=name)
        await ready_version(client, model["id"])
    gone = await make_artifact(settings, model="acme/gone", version=1, sources=[_state(3)])
    kept = await make_artifact(settings, model="acme/kept", version=1, sources=[_state(4)])
    (gone.directory / "model.tensors").unlink()  # its bytes lost from storage
    done = _backfill(settings.data_dir, database_url=database_url)
    assert done.returncode == 1
    assert "layout manifests added: 1, signed manifests added: 1, failed: 1" in done.stdout
    assert f"artifact {gone.id}: failed" in done.stderr
    assert (kept.directory / LAYOUT_FILE).is_file()
    assert not (gone.directory / LAYOUT_FILE).exists()
    assert LAYOUT_FILE not in await _kinds(client, "acme/gone")


async def test_after_backfill_the_engine_loads_through_the_manifest(
    registry: Registry,  # noqa: F811
    cache_dir: Path,  # noqa: F811
) -> None:
    name = f"acme/bf-{uuid.uuid4().hex[:10]}"
    registry.ready_model(name)
    state = _state(5)
    await make_artifact(registry.settings, model=name, version=1, sources=[state])
    with RegistryClient(registry.url, registry.token) as client:
        before = load_artifact(name, client=client, cache=NodeCache(cache_dir))
    assert before.path == "tensorizer" and "layout manifest" in (before.reason or "")

    done = _backfill(registry.settings.data_dir, "--model", name)
    assert done.returncode == 0, done.stderr
    assert "layout manifests added: 1, signed manifests added: 1, failed: 0" in done.stdout

    with RegistryClient(registry.url, registry.token) as client:
        answer = client.resolve(name)
        assert [f.kind for f in answer.files if f.path == LAYOUT_FILE] == ["layout"]
        assert answer.data["engine"]["loader"] == "engine"
        result = load_artifact(answer, client=client, cache=NodeCache(cache_dir))
    assert (result.path, result.verified) == ("engine", True)
    assert set(result.tensors) == set(state)
    for key, tensor in state.items():
        assert result.tensors[key].dtype == tensor.dtype
        assert torch.equal(result.tensors[key], tensor), key


async def test_a_model_sig_with_out_of_date_ignore_paths_is_signed_again_once(
    client: httpx.AsyncClient, settings: Settings, database_url: str
) -> None:
    """The re-sign on both backends: the new object under a key of its own, the row (size,
    sha256, key) swapped in one transaction, the old object deleted after commit, resolve
    answering with the new one; a second run changes nothing."""

    from tensor_registry_server.trust.signing_keys import model_signing_keys
    from tests.trust.test_model_signature import OLD_IGNORE_PATHS, _with_ignore_paths

    model = await create_model(client, name="acme/resign")
    await ready_version(client, model["id"])
    made = await make_artifact(settings, model="acme/resign", version=1, sources=[_state(7)])
    done = _backfill(settings.data_dir, database_url=database_url)
    assert done.returncode == 0, done.stderr
    assert "model signatures added: 1, model signatures re-signed: 0" in done.stdout
    current = (made.directory / SIGNATURE_FILE).read_bytes()
    old = _with_ignore_paths(current, model_signing_keys(settings)._active, OLD_IGNORE_PATHS)
    await replace_artifact_file(database_url, made, SIGNATURE_FILE, old)

    done = _backfill(settings.data_dir, database_url=database_url)
    assert done.returncode == 0, done.stderr
    assert "failed: 0, model signatures added: 0, model signatures re-signed: 1" in done.stdout
    (stored,) = made.directory.glob(f"{SIGNATURE_FILE}.*")
    assert not (made.directory / SIGNATURE_FILE).exists()  # deleted after commit
    new = stored.read_bytes()
    r = await client.get("/api/v1/resolve", params={"model": "acme/resign"})
    assert r.status_code == 200, r.text
    (entry,) = [f for f in r.json()["files"] if f["path"] == SIGNATURE_FILE]
    assert (entry["size"], entry["sha256"]) == (len(new), hashlib.sha256(new).hexdigest())
    published = (await client.get("/.well-known/tensor-registry/keys")).json()
    signed = model_signature.verify(
        new, model_signing_keys_from_document(published, keys_from_document(published))
    )
    assert signed.ignore_paths == model_signature.IGNORED_PATHS
    assert signed.files == model_signature.verify(current, {signed.key_hint: _pem(settings)}).files

    again = _backfill(settings.data_dir, database_url=database_url)
    assert again.returncode == 0, again.stderr
    assert "model signatures re-signed: 0" in again.stdout
    assert [p.read_bytes() for p in made.directory.glob(f"{SIGNATURE_FILE}*")] == [new]


def _pem(settings: Settings) -> bytes:
    from tensor_registry_server.trust.signing_keys import model_signing_keys

    return model_signing_keys(settings).active_pem
