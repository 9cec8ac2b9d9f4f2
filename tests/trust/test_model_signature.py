"""model.sig, the OpenSSF Model Signing (OMS v1) signature of every artifact.

Driven by the reference verifier, `model_signing verify key` from the model-signing package (a
subprocess, its default options), against directories pulled with `tensor-registry pull` from a
real `tensor-registry serve`: it accepts them with the key served at
/.well-known/tensor-registry/model-signing.pem, and refuses one flipped byte, one added file and
another key; the client's `verify` refuses the same. The backfill gives model.sig to an
artifact made without it; a model.sig swapped on the server (another key, or the registry's key
over other digests) stops `pull` and `load` before a byte is placed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric import ec

from harness.artifacts import MadeArtifact, make_artifact
from harness.serve_process import ROOT
from tensor_registry import RegistryClient
from tensor_registry.engine import load_artifact
from tensor_registry.formats import model_signature
from tensor_registry.formats.model_signature import (
    KEYFILE_PATH,
    NODE_STATE_DIR,
    PULL_RECORD,
    SIGNATURE_FILE,
)
from tensor_registry.formats.signed_manifest import MANIFEST_FILE, ed25519_verify
from tensor_registry.formats.signed_manifest import verify as verify_manifest
from tensor_registry.node_cache import NodeCache
from tensor_registry.trust import TrustError, model_signing_keys_from_document
from tensor_registry_server.settings import Settings
from tensor_registry_server.trust.signing_keys import (
    MODEL_SIGNING_KEY_FILE,
    manifest_keys,
    model_signing_keys,
)
from tests.client.conftest import Registry, registry  # noqa: F401 (fixture)
from tests.client.test_trust import oms_verify, replace_file
from tests.hf_door.hf import hf_cli
from tests.storage.conftest import s3_endpoint  # noqa: F401 (fixture)


def backfill(reg: Registry, name: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    return subprocess.run(
        [
            *(sys.executable, "-m", "tensor_registry.cli", "backfill-layouts"),
            *("--data-dir", str(reg.settings.data_dir), "--model", name),
        ],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
    )


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(300, 257, generator=g), "b.bias": torch.randn(33, generator=g)}


async def unsigned_artifact(
    reg: Registry, seed: int, *, encrypted: bool = False
) -> tuple[str, MadeArtifact]:
    """An artifact published before model.sig (and manifests) existed, then backfilled."""
    name = f"acme/oms-{uuid.uuid4().hex[:10]}"
    reg.ready_model(name)
    made = await make_artifact(
        reg.settings,
        model=name,
        version=1,
        sources=[_state(seed)],
        layout=not encrypted,
        encrypted=encrypted,
    )
    assert not (made.directory / SIGNATURE_FILE).exists()
    done = backfill(reg, name)
    assert done.returncode == 0, done.stderr
    assert "model signatures added: 1" in done.stdout, done.stdout
    assert f"artifact {made.id}: {SIGNATURE_FILE} added" in done.stderr
    for path in (MANIFEST_FILE, SIGNATURE_FILE):
        made.files[path] = (made.directory / path).read_bytes()
    return name, made


def _env(tmp_path: Path) -> dict[str, str | None]:
    return {
        "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"),
        "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "client-config"),
        "TENSOR_REGISTRY_TRUSTED_KEYS": None,
    }


def _public_files(reg: Registry, tmp_path: Path) -> tuple[Path, Path]:
    """The PEM and the keys document as anyone fetches them: no token."""
    with httpx.Client(base_url=reg.url, timeout=30) as anonymous:
        pem = anonymous.get("/.well-known/tensor-registry/model-signing.pem")
        keys = anonymous.get("/.well-known/tensor-registry/keys")
    assert pem.status_code == 200 and pem.headers["content-type"].startswith(
        "application/x-pem-file"
    ), pem.text
    assert keys.status_code == 200, keys.text
    (tmp_path / "reg.pem").write_bytes(pem.content)
    (tmp_path / "keys.json").write_bytes(keys.content)
    return tmp_path / "reg.pem", tmp_path / "keys.json"


async def test_a_pulled_directory_verifies_with_model_signing_and_tampering_is_refused(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    name, made = await unsigned_artifact(registry, seed=1)
    with registry.http() as http:
        kinds = {
            f["path"]: f["kind"]
            for f in http.get("/api/v1/resolve", params={"model": name}).json()["files"]
        }
    assert kinds[SIGNATURE_FILE] == "signature"

    pem, keys = _public_files(registry, tmp_path)
    signer = model_signing_keys(registry.settings)
    # The served key is the one that signed: its hint is the bundle's, its PEM the active one.
    assert pem.read_bytes() == signer.active_pem
    bundle = json.loads(made.files[SIGNATURE_FILE])
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == model_signature.key_hint(
        pem.read_bytes()
    )

    dest = tmp_path / "pulled"
    env = _env(tmp_path)
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert {p.name for p in dest.iterdir()} >= {SIGNATURE_FILE, MANIFEST_FILE, "model.tensors"}
    # What pull writes goes into the node state directory (signed as ignored), not beside.
    assert (dest / PULL_RECORD).is_file() and not (dest / ".tensor-registry.json").exists()

    accepted = oms_verify(dest, pem)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "Verification succeeded" in accepted.stdout
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 0, mine.stderr
    assert json.loads(mine.stdout)["model_signed_by"] == signer.active_hint

    # One flipped byte in the weights (a copy: pulled files are hard links into the cache).
    flipped = tmp_path / "flipped"
    shutil.copytree(dest, flipped)
    weights = flipped / "model.tensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    refused = oms_verify(flipped, pem)
    assert refused.returncode == 1, refused.stdout
    assert "Hash mismatch for 'model.tensors'" in refused.stderr, refused.stderr
    mine = registry.cli("verify", str(flipped), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 1 and "content_mismatch" in mine.stderr, mine.stderr
    assert not mine.stdout

    # One added file.
    added = tmp_path / "added"
    shutil.copytree(dest, added)
    (added / "extra.safetensors").write_bytes(b"not signed")
    refused = oms_verify(added, pem)
    assert refused.returncode == 1 and "Extra files" in refused.stderr, refused.stderr
    assert "extra.safetensors" in refused.stderr
    mine = registry.cli("verify", str(added), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 1 and "manifest_mismatch" in mine.stderr, mine.stderr
    assert "extra.safetensors" in mine.stderr

    # Another key: the reference verifier refuses the untouched directory.
    stranger = ec.generate_private_key(ec.SECP256R1())
    other = tmp_path / "stranger.pem"
    other.write_bytes(model_signature.public_pem(stranger.public_key()))
    refused = oms_verify(dest, other)
    assert refused.returncode == 1, refused.stdout
    # The client given keys as files: the manifest key (base64) and a PEM for model.sig.
    manifest_key = base64.b64encode(manifest_keys(registry.settings).public[0].public_key).decode()
    mine = registry.cli(
        "verify", str(dest), "--trusted-key", manifest_key, "--trusted-key", str(pem), env=env
    )
    assert mine.returncode == 0, mine.stderr
    assert json.loads(mine.stdout)["model_signed_by"] == signer.active_hint
    mine = registry.cli(
        "verify", str(dest), "--trusted-key", manifest_key, "--trusted-key", str(other), env=env
    )
    assert mine.returncode == 1 and "untrusted_signing_key" in mine.stderr, mine.stderr
    assert SIGNATURE_FILE in mine.stderr


async def test_a_folder_from_hf_download_local_dir_verifies_despite_its_cache_folder(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`hf download --local-dir` keeps `.cache/huggingface/` (resume metadata, a .gitignore)
    beside the files: both verifiers accept that folder and still refuse any other file."""
    name, made = await unsigned_artifact(registry, seed=4)
    pem, keys = _public_files(registry, tmp_path)
    dest = tmp_path / "hf-local"
    done = hf_cli(
        registry.url, registry.token, tmp_path / "home",
        "download", name, "--revision", "1.float32.hf.tp1", "--local-dir", str(dest),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (dest / ".cache" / "huggingface").is_dir()
    assert (dest / SIGNATURE_FILE).read_bytes() == made.files[SIGNATURE_FILE]
    accepted = oms_verify(dest, pem)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    env = _env(tmp_path)
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 0, mine.stderr

    (dest / ".cache" / "other.bin").write_bytes(b"not signed")
    refused = oms_verify(dest, pem)
    assert refused.returncode == 1 and ".cache/other.bin" in refused.stderr, refused.stderr
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 1 and "manifest_mismatch" in mine.stderr, mine.stderr


async def test_an_encrypted_artifact_pulled_with_its_key_file_verifies(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    name, _ = await unsigned_artifact(registry, seed=6, encrypted=True)
    pem, _ = _public_files(registry, tmp_path)
    dest = tmp_path / "pulled"
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=_env(tmp_path))
    assert pulled.returncode == 0, pulled.stderr
    # pull wrote the key file (0600) and its record into the node state directory, which
    # model.sig signs as ignored: the folder verifies as it is.
    assert oct((dest / KEYFILE_PATH).stat().st_mode & 0o777) == "0o600"
    assert (dest / PULL_RECORD).is_file()
    assert not (dest / "tensorizer.key").exists() and not (dest / ".tensor-registry.json").exists()
    accepted = oms_verify(dest, pem)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    (dest / "notes.txt").write_text("added")
    refused = oms_verify(dest, pem)
    assert refused.returncode == 1 and "notes.txt" in refused.stderr


# The names a client before the node state directory wrote at the top level, and the
# ignore_paths model.sig signed then (the reference verifier ignores each as a prefix).
OLD_NODE_FILES = (".tensor-registry.json", "tensorizer.key", "keys.json")
OLD_IGNORE_PATHS = [
    *model_signature.GIT_PATHS,
    SIGNATURE_FILE,
    *OLD_NODE_FILES,
    model_signature.HF_LOCAL_DIR_CACHE,
]


def _copy(dest: Path, to: Path) -> Path:
    shutil.copytree(dest, to, symlinks=True)
    return to


async def test_files_planted_under_a_node_files_name_fail_the_reference_verifier(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The attack: arbitrary files under a `tensorizer.key/` (or `.tensor-registry.json/`,
    `keys.json/`) directory of a pulled folder. model.sig's ignore_paths name no loose file, so
    the reference verifier (prefix semantics) sees them as the extra files they are."""
    name, _ = await unsigned_artifact(registry, seed=7, encrypted=True)
    pem, keys = _public_files(registry, tmp_path)
    env = _env(tmp_path)
    dest = tmp_path / "pulled"
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert (dest / KEYFILE_PATH).is_file() and (dest / PULL_RECORD).is_file()
    accepted = oms_verify(dest, pem)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    for old in OLD_NODE_FILES:
        planted = _copy(dest, tmp_path / f"planted-{old.strip('.')}")
        (planted / old).mkdir()
        (planted / old / "evil.py").write_text("import os\n")
        refused = oms_verify(planted, pem)
        assert refused.returncode == 1, (old, refused.stdout + refused.stderr)
        assert "Extra files" in refused.stderr and f"{old}/evil.py" in refused.stderr
        mine = registry.cli("verify", str(planted), "--trusted-key", str(keys), env=env)
        assert mine.returncode == 1 and "manifest_mismatch" in mine.stderr, mine.stderr
        assert f"{old}/evil.py" in mine.stderr


async def test_a_file_in_the_node_state_directory_passes_the_reference_verifier_not_ours(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`.cache/tensor-registry/` is the node's declared state directory (like hf's
    `.cache/huggingface/`): the reference verifier ignores everything under it, the residual
    docs/trust.md names; `tensor-registry verify` ignores only pull.json, tensorizer.key and
    keys.json there, as regular files."""
    name, _ = await unsigned_artifact(registry, seed=8)
    pem, keys = _public_files(registry, tmp_path)
    env = _env(tmp_path)
    dest = tmp_path / "pulled"
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=env)
    assert pulled.returncode == 0, pulled.stderr
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 0, mine.stderr
    (dest / NODE_STATE_DIR / "evil.py").write_text("import os\n")
    accepted = oms_verify(dest, pem)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 1 and "manifest_mismatch" in mine.stderr, mine.stderr
    assert f"{NODE_STATE_DIR}/evil.py" in mine.stderr
    # A directory by a node file's name there is no node file either.
    (dest / NODE_STATE_DIR / "evil.py").unlink()
    (dest / KEYFILE_PATH).mkdir()
    (dest / KEYFILE_PATH / "x").write_text("x")
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 1 and f"{KEYFILE_PATH}/x" in mine.stderr, mine.stderr


async def test_verify_reads_the_pull_record_an_older_client_wrote_at_the_top(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A folder pulled before the node state directory: its record at `.tensor-registry.json`
    (and its key at `tensorizer.key`) is read and ignored as those files; without a record the
    weights pull left remote are missing."""
    name, _ = await unsigned_artifact(registry, seed=9, encrypted=True)
    _, keys = _public_files(registry, tmp_path)
    env = _env(tmp_path)
    dest = tmp_path / "pulled"
    pulled = registry.cli("pull", name, "--dest", str(dest), env=env)  # weights stay remote
    assert pulled.returncode == 0, pulled.stderr
    assert not (dest / "model.tensors").exists()
    (dest / PULL_RECORD).rename(dest / ".tensor-registry.json")
    (dest / KEYFILE_PATH).rename(dest / "tensorizer.key")
    shutil.rmtree(dest / ".cache")
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 0, mine.stderr
    # The record is what let the remote weights be skipped: without it they are missing.
    (dest / ".tensor-registry.json").rename(tmp_path / "record.json")
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 1 and "model.tensors is missing" in mine.stderr, mine.stderr
    # A directory by the old name is never taken as the record.
    (dest / ".tensor-registry.json").mkdir()
    (dest / ".tensor-registry.json" / "pull.json").write_bytes(
        (tmp_path / "record.json").read_bytes()
    )
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 1, mine.stderr
    # Pulling into the old folder again moves what the node keeps into its state directory.
    shutil.rmtree(dest / ".tensor-registry.json")
    (tmp_path / "record.json").rename(dest / ".tensor-registry.json")
    again = registry.cli("pull", name, "--dest", str(dest), env=env)
    assert again.returncode == 0, again.stderr
    assert (dest / PULL_RECORD).is_file() and (dest / KEYFILE_PATH).is_file()
    assert not (dest / ".tensor-registry.json").exists() and not (dest / "tensorizer.key").exists()
    mine = registry.cli("verify", str(dest), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 0, mine.stderr


def _with_ignore_paths(data: bytes, key: Any, ignore_paths: list[str]) -> bytes:
    """``data`` (a model.sig) with its statement's ignore_paths replaced, signed again with
    ``key``: what the registry wrote before the node state directory."""
    from cryptography.hazmat.primitives import hashes

    from tensor_registry.formats.signed_manifest import pae

    payload = base64.b64decode(json.loads(data)["dsseEnvelope"]["payload"])
    statement = json.loads(payload)
    statement["predicate"]["serialization"]["ignore_paths"] = ignore_paths
    new = json.dumps(statement, indent=2).encode()
    sig = key.sign(pae(model_signature.PAYLOAD_TYPE, new), ec.ECDSA(hashes.SHA256()))
    return model_signature.bundle(new, sig, model_signature.key_hint(registry_pem_of(key)))


def registry_pem_of(key: Any) -> bytes:
    return model_signature.public_pem(key.public_key())


def _signed_ignore_paths(data: bytes) -> list[str]:
    payload = json.loads(base64.b64decode(json.loads(data)["dsseEnvelope"]["payload"]))
    return list(payload["predicate"]["serialization"]["ignore_paths"])


async def test_backfill_signs_again_a_model_sig_with_the_old_ignore_paths(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    name, made = await unsigned_artifact(registry, seed=10)
    pem, keys = _public_files(registry, tmp_path)
    env = _env(tmp_path)
    signer = model_signing_keys(registry.settings)
    old = _with_ignore_paths(made.files[SIGNATURE_FILE], signer._active, OLD_IGNORE_PATHS)
    await replace_file(registry, made, SIGNATURE_FILE, old)
    # model.sig covers the signed manifest, never the other way round: re-signing it leaves
    # manifest.sig.json valid.
    manifest = verify_manifest(
        made.files[MANIFEST_FILE], manifest_keys(registry.settings).trusted()
    )
    assert SIGNATURE_FILE not in manifest.files

    # Signed with the old list, the reference verifier passes the attack...
    dest = tmp_path / "pulled"
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert (dest / SIGNATURE_FILE).read_bytes() == old
    planted = _copy(dest, tmp_path / "planted")
    shutil.rmtree(planted / ".cache")
    (planted / "tensorizer.key").mkdir()
    (planted / "tensorizer.key" / "evil.py").write_text("import os\n")
    passed = oms_verify(planted, pem)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    # ...and refuses what a client writes now (its state directory is not in the old list).
    refused = oms_verify(dest, pem)
    assert refused.returncode == 1 and PULL_RECORD in refused.stderr, refused.stderr

    done = backfill(registry, name)
    assert done.returncode == 0, done.stderr
    assert "model signatures added: 0, model signatures re-signed: 1" in done.stdout, done.stdout
    assert f"artifact {made.id}: {SIGNATURE_FILE} signed again" in done.stderr
    fresh = tmp_path / "fresh"
    pulled = registry.cli("pull", name, "--dest", str(fresh), "--weights", env=env)
    assert pulled.returncode == 0, pulled.stderr
    new = (fresh / SIGNATURE_FILE).read_bytes()
    assert new != old
    assert _signed_ignore_paths(new) == list(model_signature.IGNORED_PATHS)
    assert _signed_ignore_paths(new) == [
        *model_signature.GIT_PATHS,
        SIGNATURE_FILE,
        ".cache/huggingface",
        ".cache/tensor-registry",
    ]
    accepted = oms_verify(fresh, pem)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    planted = _copy(fresh, tmp_path / "planted-again")
    (planted / "tensorizer.key").mkdir()
    (planted / "tensorizer.key" / "evil.py").write_text("import os\n")
    refused = oms_verify(planted, pem)
    assert refused.returncode == 1 and "Extra files" in refused.stderr, refused.stderr
    mine = registry.cli("verify", str(fresh), "--trusted-key", str(keys), env=env)
    assert mine.returncode == 0, mine.stderr
    # The new object has a key of its own; the old one was deleted after the commit.
    assert not (made.directory / SIGNATURE_FILE).exists()
    (stored,) = made.directory.glob(f"{SIGNATURE_FILE}.*")
    assert stored.read_bytes() == new

    again = backfill(registry, name)
    assert again.returncode == 0, again.stderr
    assert "model signatures re-signed: 0" in again.stdout, again.stdout
    assert [p.read_bytes() for p in made.directory.glob(f"{SIGNATURE_FILE}*")] == [new]


async def test_backfill_does_not_resign_over_rows_the_old_signature_does_not_sign(
    registry: Registry,  # noqa: F811
) -> None:
    """A re-sign vouches only for what was signed: rows changed since (storage and row, the
    signing key out of reach) are reported, and the old model.sig stays."""
    name, made = await unsigned_artifact(registry, seed=11)
    signer = model_signing_keys(registry.settings)
    old = _with_ignore_paths(made.files[SIGNATURE_FILE], signer._active, OLD_IGNORE_PATHS)
    await replace_file(registry, made, SIGNATURE_FILE, old)
    await replace_file(registry, made, "config.json", b'{"edited": true}')
    done = backfill(registry, name)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "model signatures re-signed: 0" in done.stdout and "failed: 1" in done.stdout
    assert "config.json" in done.stderr
    assert (made.directory / SIGNATURE_FILE).read_bytes() == old


async def test_backfill_leaves_a_signed_artifact_alone(
    registry: Registry,  # noqa: F811
) -> None:
    name, made = await unsigned_artifact(registry, seed=2)
    again = backfill(registry, name)
    assert again.returncode == 0, again.stderr
    assert "model signatures added: 0, model signatures re-signed: 0" in again.stdout
    assert (made.directory / SIGNATURE_FILE).read_bytes() == made.files[SIGNATURE_FILE]
    # model.sig covers every other file, the signed manifest and the layout included.
    signed = model_signature.verify(
        made.files[SIGNATURE_FILE],
        {model_signing_keys(registry.settings).active_hint: registry_pem(registry)},
    )
    on_disk = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in made.directory.iterdir()
        if p.name != SIGNATURE_FILE
    }
    assert signed.files == on_disk and MANIFEST_FILE in signed.files
    assert signed.name == f"{name}:1.float32.hf.tp1"


def registry_pem(reg: Registry) -> bytes:
    return model_signing_keys(reg.settings).active_pem


def _resigned(made: MadeArtifact, key: Any, **digests: str) -> bytes:
    """``made``'s model.sig re-signed with ``key``, over its files with ``digests`` changed."""
    payload = json.loads(made.files[SIGNATURE_FILE])["dsseEnvelope"]["payload"]
    statement = json.loads(base64.b64decode(payload))
    files = {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    files.update(digests)
    return model_signature.sign(key, sorted(files.items()), name=statement["subject"][0]["name"])


async def test_a_swapped_model_sig_stops_pull_and_load_before_any_byte_is_placed(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = _env(tmp_path)
    cache = tmp_path / "cache"

    # Signed by a key the registry never published (storage and row both replaced).
    name, made = await unsigned_artifact(registry, seed=3)
    stranger = ec.generate_private_key(ec.SECP256R1())
    await replace_file(registry, made, SIGNATURE_FILE, _resigned(made, stranger))
    dest = tmp_path / "pulled"
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=env)
    assert pulled.returncode == 1 and "untrusted_signing_key" in pulled.stderr, pulled.stderr
    assert list(dest.iterdir()) == [] and not (cache / "objects").exists()

    # Signed with the registry's own key, but over other weights than the ones served.
    name, made = await unsigned_artifact(registry, seed=4)
    forged = _resigned(
        made, model_signing_keys(registry.settings)._active, **{"model.tensors": "0" * 64}
    )
    await replace_file(registry, made, SIGNATURE_FILE, forged)
    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(tmp_path / "client-config"))
    monkeypatch.delenv("TENSOR_REGISTRY_TRUSTED_KEYS", raising=False)
    with (
        RegistryClient(registry.url, registry.token) as client,
        pytest.raises(TrustError) as caught,
    ):
        load_artifact(name, client=client, cache=NodeCache(cache))
    assert caught.value.code == "content_mismatch" and "model.tensors" in str(caught.value)
    pulled = registry.cli("pull", name, "--dest", str(dest), "--weights", env=env)
    assert pulled.returncode == 1 and "content_mismatch" in pulled.stderr, pulled.stderr
    assert list(dest.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# The key: generated once, served, endorsed, rotated


async def test_the_model_signing_key_is_served_as_pem_and_endorsed_by_the_manifest_key(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    r = await client.get(
        "/.well-known/tensor-registry/model-signing.pem", headers={"Authorization": ""}
    )
    assert r.status_code == 200 and r.text.startswith("-----BEGIN PUBLIC KEY-----"), r.text
    path = settings.data_dir.resolve() / "secrets" / MODEL_SIGNING_KEY_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    private = path.read_text()
    assert "PRIVATE KEY" in private and private.strip() not in r.text
    key = model_signature.load_public_pem(r.content)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    hint = model_signature.key_hint(r.content)

    document = (await client.get("/.well-known/tensor-registry/keys")).json()
    (entry,) = document["model_signing_keys"]
    assert (entry["keyid"], entry["status"], entry["algorithm"]) == (
        hint,
        "active",
        "ecdsa-p256-sha256",
    )
    assert entry["public_key_pem"].encode() == r.content
    ed = manifest_keys(settings).trusted()
    (endorsement,) = entry["endorsements"]
    assert ed25519_verify(
        ed[endorsement["keyid"]],
        base64.b64decode(endorsement["sig"]),
        model_signature.endorsement_message(r.content),
    )
    assert model_signing_keys_from_document(document, ed) == {hint: r.content}
    # Endorsed by nobody the client trusts: not accepted.
    assert model_signing_keys_from_document(document, {"0" * 64: b"\0" * 32}) == {}

    by_id = await client.get(f"/.well-known/tensor-registry/model-signing/{hint}.pem")
    assert by_id.status_code == 200 and by_id.content == r.content
    unknown = await client.get(f"/.well-known/tensor-registry/model-signing/{'a' * 64}.pem")
    assert unknown.status_code == 404 and unknown.json()["code"] == "key_not_found"
    spec = (await client.get("/openapi.json")).json()
    assert "/.well-known/tensor-registry/model-signing.pem" in spec["paths"]


def test_rotation_keeps_the_old_model_signing_key_published_and_endorsed(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    pem = new.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    old_public = model_signature.public_pem(old.public_key())
    rotated = Settings(
        data_dir=tmp_path,
        security={  # type: ignore[arg-type]
            "model_signing_key": pem,
            "model_signing_previous_public_keys": [old_public.decode()],
        },
    )
    keys = model_signing_keys(rotated)
    assert keys.active_pem == model_signature.public_pem(new.public_key())
    assert [k.status for k in keys.public] == ["active", "previous"]
    assert keys.pem(model_signature.key_hint(old_public)) == old_public
    trusted = model_signing_keys_from_document(
        {"model_signing_keys": keys.document()}, manifest_keys(rotated).trusted()
    )
    assert set(trusted) == {keys.active_hint, model_signature.key_hint(old_public)}
    assert not (tmp_path / "secrets" / MODEL_SIGNING_KEY_FILE).exists()  # configured
    # A model.sig signed before the rotation still verifies with the published old key.
    before = model_signature.sign(old, [("model.tensors", "ab" * 32)], name="acme/x:1")
    assert model_signature.verify(before, trusted).files == {"model.tensors": "ab" * 32}

    with pytest.raises(ValueError, match="P-256"):
        model_signing_keys(
            Settings(
                data_dir=tmp_path,
                security={  # type: ignore[arg-type]
                    "model_signing_key": ec.generate_private_key(ec.SECP384R1())
                    .private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
                    .decode()
                },
            )
        )


# ---------------------------------------------------------------------------------------------
# The scaled setup: PostgreSQL, S3, the key given as a setting, the worker publishing


def test_on_postgresql_and_s3_the_worker_signs_and_a_pulled_directory_verifies(
    tmp_path_factory: pytest.TempPathFactory,
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    from harness.serve_process import ServeProcess, free_port
    from harness.waiting import wait_job, wait_live_worker
    from tests.client.conftest import TOKEN
    from tests.conftest import migrated_database
    from tests.hf_fixtures import make_tiny_gpt2
    from tests.pipeline.helpers import publish_dir, tensorize
    from tests.storage.conftest import S3_KEY_ID, S3_SECRET, make_bucket

    key = ec.generate_private_key(ec.SECP256R1())
    configured_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    with migrated_database("postgresql", tmp_path_factory, label="oms") as database_url:
        data_dir = tmp_path / "data"
        server = ServeProcess(
            data_dir=data_dir,
            port=free_port(),
            worker=True,
            env={
                "TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN,
                "TENSOR_REGISTRY_DATABASE__URL": database_url,
                "TENSOR_REGISTRY_STORAGE__DEFAULT_BACKEND": "s3",
                "TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL": s3_endpoint,
                "TENSOR_REGISTRY_STORAGE__S3__BUCKET": make_bucket(s3_endpoint),
                "TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID": S3_KEY_ID,
                "TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY": S3_SECRET,
                "TENSOR_REGISTRY_SECURITY__MODEL_SIGNING_KEY": configured_pem,
                "TENSOR_REGISTRY_WORKER__HEARTBEAT_SECONDS": "1",
            },
        ).start()
        try:
            name = f"acme/oms-{uuid.uuid4().hex[:10]}"

            async def publish() -> tuple[dict[str, Any], bytes]:
                async with httpx.AsyncClient(
                    base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
                ) as api:
                    src = make_tiny_gpt2(tmp_path / "src")
                    model_id, _ = await publish_dir(api, src, name=name)
                    await wait_live_worker(api)
                    job = await tensorize(api, model_id, dtype="float32", format="hf")
                    done = await wait_job(api, job["id"], timeout=300)
                    assert done["status"] == "succeeded", done
                    r = await api.get(f"/api/v1/artifacts/{done['artifact_id']}")
                    pem = await api.get("/.well-known/tensor-registry/model-signing.pem")
                    return dict(r.json()), pem.content

            # A sync test: migrated_database drives its own event loop.
            artifact, served = asyncio.run(publish())
            assert artifact["storage"] == "s3"
            assert SIGNATURE_FILE in {f["path"] for f in artifact["files"]}
            # The served key is the configured one; no key file was generated beside it.
            assert served == model_signature.public_pem(key.public_key())
            assert not (data_dir / "secrets" / MODEL_SIGNING_KEY_FILE).exists()
            pem = tmp_path / "registry.pem"
            pem.write_bytes(served)

            dest = tmp_path / "pulled"
            env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
            pulled = subprocess.run(
                [
                    *(sys.executable, "-m", "tensor_registry.cli", "pull", name),
                    *("--dest", str(dest), "--weights"),
                ],
                cwd=ROOT,
                env={
                    **env,
                    "PYTHONPATH": str(ROOT),
                    "TENSOR_REGISTRY_URL": server.url,
                    "TENSOR_REGISTRY_TOKEN": TOKEN,
                    "TENSOR_REGISTRY_CONFIG_DIR": str(tmp_path / "cfg"),
                    "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"),
                },
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert pulled.returncode == 0, pulled.stderr
            accepted = oms_verify(dest, pem)
            assert accepted.returncode == 0, accepted.stdout + accepted.stderr
            (dest / "config.json").write_bytes(b"{}")  # replaced (the original is a hard link)
            refused = oms_verify(dest, pem)
            assert refused.returncode == 1 and "config.json" in refused.stderr
        finally:
            server.stop()
