"""Writing an artifact's signed manifest (tensor_registry_server/trust/statements.py): at publish,
and as a backfill.

At publish (tensorize and verify jobs, right after the layout manifest) the worker knows the
provenance first-hand: the source version and its file digests, the job, its own toolchain
(the versions tensor_registry_server/jobs/capabilities.py advertises) and GPU, and when the job
started and
finished. The manifest is signed with the registry's key (the worker reads the same settings
as the API) and committed as one more file of the artifact, ``manifest.sig.json``; the
compatibility key and the provenance also go into the artifact's ``stats`` so resolve and the
UI read them without opening the file.

``backfill_manifest`` signs the manifest of an artifact published before manifests existed:
provenance then comes from the rows (``provenance.backfilled`` says so), the toolchain from
what the artifact row recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from tensor_registry.formats import model_signature
from tensor_registry.formats.signed_manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    ManifestError,
    ManifestFile,
    SignedManifest,
    verify,
)
from tensor_registry_server.artifacts.making.layout_writer import (
    store_artifact_file,
    write_object,
)
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.invalidation import mark_changed
from tensor_registry_server.jobs.lifecycle import PublishedFile
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionFile
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.base import Storage
from tensor_registry_server.storage.deferred_delete import delete_after_commit
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.trust.signing_keys import (
    ManifestKeys,
    ModelSigningKeys,
    foreign_keys,
    manifest_keys,
    model_signing_keys,
)
from tensor_registry_server.trust.statements import (
    CONFIG_FILE,
    Variant,
    compatibility_of,
    signed_manifest,
    signed_model,
)

MAX_CONFIG_BYTES = 4 << 20


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def _read_config(storage: Storage, files: list[PublishedFile]) -> tuple[bytes | None, str | None]:
    entry = next((f for f in files if f.path == CONFIG_FILE), None)
    if entry is None or entry.size > MAX_CONFIG_BYTES:
        return None, None
    with storage.open_source(entry.storage_key) as source:
        return source.read(MAX_CONFIG_BYTES), entry.sha256


def gpu_facts(device: str | None) -> dict[str, Any] | None:
    """Name and compute capability of the job's GPU; None for a CPU job."""
    if not device or not device.startswith("cuda"):
        return None
    import torch

    index = torch.device(device).index or 0
    major, minor = torch.cuda.get_device_capability(index)
    return {"name": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}"}


def gpu_arch(gpu: dict[str, Any] | None) -> str:
    return f"sm_{gpu['capability'].replace('.', '')}" if gpu else "cpu"


def toolchain() -> dict[str, str | None]:
    import platform

    from tensor_registry_server.jobs.capabilities import _version

    return {
        "python": platform.python_version(),
        "tensorizer": _version("tensorizer"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "vllm": _version("vllm"),
    }


def variant_of(artifact: Artifact, model: str) -> Variant:
    return Variant(
        artifact_id=str(artifact.id),
        model_id=str(artifact.model_id),
        model=model,
        version=artifact.version_number,
        dtype=artifact.dtype,
        format=artifact.format,
        tensor_parallel_size=artifact.tensor_parallel_size,
        encrypted=bool(artifact.encrypted),
        key_id=artifact.key_id,
        encryption_algorithm=artifact.encryption_algorithm,
    )


def build(
    settings: Settings,
    storage: Storage,
    files: list[PublishedFile],
    *,
    variant: Variant,
    provenance: dict[str, Any],
    tools: dict[str, str | None],
    gpu: dict[str, Any] | None,
) -> tuple[bytes, dict[str, Any]]:
    """The signed manifest's bytes and the facts that go into the artifact's ``stats``."""
    config, config_sha = _read_config(storage, files)
    compatibility = compatibility_of(
        variant,
        config=config,
        config_sha256=config_sha,
        vllm_version=tools.get("vllm"),
        gpu_arch=gpu_arch(gpu),
    )
    keys = manifest_keys(settings)
    provenance = {**provenance, "toolchain": tools, "gpu": gpu}
    data = signed_manifest(
        keys,
        registry=settings.public_base_url,
        variant=variant,
        files=[ManifestFile(f.path, f.size, f.sha256) for f in files],
        compatibility=compatibility,
        provenance=provenance,
        signed_at=_iso(utcnow()) or "",
    )
    stats = {
        "compatibility_key": compatibility,
        "provenance": provenance,
        "manifest_key_id": keys.active_id,
    }
    return data, stats


def public_uri(uri: str) -> str:
    """A source URI without what may be a credential (user info, query, fragment)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def source_files(files: list[Any]) -> list[dict[str, Any]]:
    listed = sorted(files, key=lambda f: f.path)
    return [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in listed]


def add_manifest(
    settings: Settings,
    outputs: Any,
    files: list[PublishedFile],
    *,
    variant: Variant,
    provenance: dict[str, Any],
    device: str | None,
) -> tuple[list[PublishedFile], dict[str, Any]]:
    """Sign the manifest of the committed ``files``, then ``model.sig`` over them and the
    manifest, and commit both beside them; returns every file and the stats to record."""
    gpu = gpu_facts(device)
    data, stats = build(
        settings,
        outputs.storage,
        files,
        variant=variant,
        provenance={**provenance, "finished_at": _iso(utcnow())},
        tools=toolchain(),
        gpu=gpu,
    )
    outputs.sink(MANIFEST_FILE).write(data)
    # model.sig last, over every other file: the manifest's digest is that of ``data``.
    signed = [ManifestFile(f.path, f.size, f.sha256) for f in files if f.path != MANIFEST_FILE]
    signed.append(ManifestFile(MANIFEST_FILE, len(data), hashlib.sha256(data).hexdigest()))
    oms = signed_model(model_signing_keys(settings), variant=variant, files=signed)
    outputs.sink(SIGNATURE_FILE).write(oms)
    stats["model_signing_key_id"] = model_signing_keys(settings).active_hint
    return outputs.commit_all(), stats


async def backfill_manifest(
    session: AsyncSession, settings: Settings, storage: Storage, artifact_id: uuid.UUID
) -> bool:
    """Sign artifact ``artifact_id``'s manifest; False if it already had one. Run it after
    ``backfill_layout`` so the layout's digest is covered. The caller commits ``session``."""
    artifact = (
        await session.execute(
            select(Artifact).where(Artifact.id == artifact_id).options(selectinload(Artifact.files))
        )
    ).scalar_one()
    if any(f.path == MANIFEST_FILE for f in artifact.files):
        return False
    model = await session.get(Model, artifact.model_id)
    version = await session.get(Version, artifact.version_id)
    version_files = (
        await session.execute(
            select(VersionFile).where(VersionFile.version_id == artifact.version_id)
        )
    ).scalars()
    files = [PublishedFile(f.path, f.size, f.sha256, f.storage_key) for f in artifact.files]
    stats = dict(artifact.stats or {})
    provenance = {
        "source_version": {
            "id": str(artifact.version_id),
            "number": version.number if version is not None else artifact.version_number,
            "files": source_files(list(version_files)),
        },
        "origin": artifact.origin,
        "job_id": str(artifact.job_id) if artifact.job_id else None,
        "worker": stats.get("worker"),
        "device": stats.get("device"),
        "started_at": _iso(artifact.created_at),
        "finished_at": _iso(artifact.ready_at),
        "backfilled": True,
    }
    tools = {
        "tensorizer": artifact.tensorizer_version,
        "torch": artifact.torch_version,
        "transformers": artifact.transformers_version,
        "vllm": None,
    }
    data, extra = build(
        settings,
        storage,
        files,
        variant=variant_of(artifact, model.name if model is not None else ""),
        provenance=provenance,
        tools=tools,
        gpu=None,
    )
    store_artifact_file(storage, artifact, MANIFEST_FILE, data)
    artifact.stats = {**stats, **extra}
    await session.flush()
    # The file row alone is not a tracked table: say the model changed.
    mark_changed(session, artifact.model_id)
    return True


async def _model_sig_of_rows(
    session: AsyncSession, keys: ModelSigningKeys, artifact: Artifact
) -> bytes:
    """``model.sig`` over the artifact's files as its rows record them (no byte read)."""
    model = await session.get(Model, artifact.model_id)
    return signed_model(
        keys,
        variant=variant_of(artifact, model.name if model is not None else ""),
        files=[ManifestFile(f.path, f.size, f.sha256) for f in artifact.files],
    )


async def backfill_model_signature(
    session: AsyncSession, settings: Settings, storage: Storage, artifact_id: uuid.UUID
) -> bool:
    """Write artifact ``artifact_id``'s ``model.sig`` from the digests its rows record; False
    if it already has one, or has no signed manifest yet (run ``backfill_manifest`` first, so
    the manifest is covered). The caller commits ``session``."""
    artifact = (
        await session.execute(
            select(Artifact).where(Artifact.id == artifact_id).options(selectinload(Artifact.files))
        )
    ).scalar_one()
    paths = {f.path for f in artifact.files}
    if SIGNATURE_FILE in paths or MANIFEST_FILE not in paths:
        return False
    keys = model_signing_keys(settings)
    data = await _model_sig_of_rows(session, keys, artifact)
    store_artifact_file(storage, artifact, SIGNATURE_FILE, data)
    artifact.stats = {**(artifact.stats or {}), "model_signing_key_id": keys.active_hint}
    await session.flush()
    mark_changed(session, artifact.model_id)
    return True


def signed_ignore_paths(data: bytes) -> tuple[str, ...] | None:
    """The ``ignore_paths`` a ``model.sig`` signs (read, not verified: it only picks what to
    re-sign); None when the bytes are no bundle of a statement."""
    try:
        payload = json.loads(data)["dsseEnvelope"]["payload"]
        serialization = json.loads(base64.b64decode(payload))["predicate"]["serialization"]
        paths = serialization["ignore_paths"]
    except (ValueError, TypeError, KeyError):
        return None
    return tuple(str(p) for p in paths) if isinstance(paths, list) else None


async def resign_model_signature(
    session: AsyncSession,
    settings: Settings,
    storage: Storage,
    storages: StorageRegistry,
    artifact_id: uuid.UUID,
) -> bool:
    """Sign artifact ``artifact_id``'s ``model.sig`` again when the ``ignore_paths`` it signs
    are not today's (``model_signature.IGNORED_PATHS``: one made before the node's files moved
    into ``.cache/tensor-registry/`` names loose files, which the reference verifier ignores as
    directories too); False when it has none or its list is current (so a second run changes
    nothing). The old signature must verify with a published model-signing key over exactly
    the digests the rows record, so a re-sign never vouches for a row changed since (raises
    ManifestError). The new object is written under a key of its own and the file row (size,
    sha256, key) swapped to it in the caller's transaction; the old object is deleted after
    commit, and the resolve cache dropped (``mark_changed``): a reader sees the old pair or
    the new one, never a row naming bytes it does not hash to. The caller commits."""
    artifact = (
        await session.execute(
            select(Artifact)
            .where(Artifact.id == artifact_id)
            .options(selectinload(Artifact.files))
            .with_for_update()
        )
    ).scalar_one()
    row = next((f for f in artifact.files if f.path == SIGNATURE_FILE), None)
    if row is None:
        return False
    if row.size > model_signature.MAX_SIGNATURE_BYTES:
        raise ManifestError("bad_signature", f"a {SIGNATURE_FILE} of {row.size:,} bytes")
    old = await storage.read_bytes(row.storage_key, length=row.size)
    if hashlib.sha256(old).hexdigest() != row.sha256:
        raise ManifestError(
            "content_mismatch", f"the stored {SIGNATURE_FILE} is not the one its row records"
        )
    if signed_ignore_paths(old) == model_signature.IGNORED_PATHS:
        return False
    keys = model_signing_keys(settings)
    recorded = {f.path: f.sha256 for f in artifact.files if f.path != SIGNATURE_FILE}
    model_signature.verify(old, {k.hint: k.pem for k in keys.public}).check_files(
        recorded, what=f"artifact {artifact_id}'s rows"
    )
    data = await _model_sig_of_rows(session, keys, artifact)
    key = f"{artifact.storage_prefix}{SIGNATURE_FILE}.{uuid.uuid4().hex[:12]}"
    stored = write_object(storage, key, data)
    try:
        old_key = row.storage_key
        row.size, row.sha256, row.storage_key = stored.size, stored.sha256, stored.key
        artifact.stats = {**(artifact.stats or {}), "model_signing_key_id": keys.active_hint}
        await session.flush()
    except BaseException:
        await storage.delete(stored.key)
        raise
    delete_after_commit(session, storages, artifact.storage, old_key)
    mark_changed(session, artifact.model_id)
    return True


def publish_manifest(
    ctx: Any,
    outputs: Any,
    files: list[PublishedFile],
    *,
    artifact: Artifact,
    version: Version,
    version_files: list[Any],
    started_at: datetime,
    device: str | None,
    extra: dict[str, Any] | None = None,
) -> tuple[list[PublishedFile], dict[str, Any]]:
    """The publish step of a job (``ctx`` a tensor_registry_server.jobs.runner.JobContext)."""

    async def name() -> str:
        async with ctx.runtime.task_session() as session:
            model = await session.get(Model, artifact.model_id)
            return model.name if model is not None else ""

    provenance = {
        "source_version": {
            "id": str(version.id),
            "number": version.number,
            "files": source_files(version_files),
        },
        "origin": artifact.origin,
        "job_id": str(ctx.job.id),
        "job_kind": ctx.job.kind,
        "attempt": ctx.job.attempts,
        "worker": ctx.worker,
        "device": device,
        "started_at": _iso(started_at),
        **(extra or {}),
    }
    return add_manifest(
        ctx.settings,
        outputs,
        files,
        variant=variant_of(artifact, ctx.runtime.run(name())),
        provenance=provenance,
        device=device,
    )


def _verify_unretired(data: bytes, own: ManifestKeys, foreign: dict[str, bytes]) -> SignedManifest:
    """``data`` verified with this registry's keys or the foreign ones it trusts, never with a
    key it retired (even one also listed as foreign). A bundle whose only valid signature is by
    a retired key is ``retired_signing_key``, whenever it was signed: a key is retired because
    it should vouch for nothing any more, and a signed time is the key holder's own claim."""
    retired = own.retired()
    trusted = {kid: key for kid, key in {**own.trusted(), **foreign}.items() if kid not in retired}
    try:
        return verify(data, trusted)
    except ManifestError as exc:
        if exc.code != "untrusted_signing_key" or not retired:
            raise
        try:
            by_retired = verify(data, retired)
        except ManifestError:
            raise exc from None
        raise ManifestError(
            "retired_signing_key",
            f"the bundle is signed by key {by_retired.key_id[:16]}…, which this registry "
            "retired (security.manifest_retired_public_keys): export it again from a registry "
            "that signs with a current key",
        ) from None


def check_foreign_manifest(
    settings: Settings,
    data: bytes,
    files: list[PublishedFile],
    *,
    variant: dict[str, Any],
) -> dict[str, Any]:
    """A registered source's own signed manifest (an exported bundle): it must verify with
    this registry's keys or ``security.trusted_manifest_keys``, describe this variant, and
    sign exactly the files that were committed (every one, not only the weights). Returns
    what provenance records of it.
    Raises ManifestError (the job fails with its code)."""
    signed = _verify_unretired(data, manifest_keys(settings), foreign_keys(settings))
    artifact = signed.artifact
    for name, value in variant.items():
        if artifact.get(name) != value:
            raise ManifestError(
                "manifest_mismatch",
                f"the bundle's signed manifest is for {name}={artifact.get(name)!r}, not {value!r}",
            )
    # Every file the import stores (weights, config, tokenizer, layout) is the signed one, and
    # every signed file is stored: an edited config.json fails like edited weights.
    signed_files = signed.files
    stored = {f.path: f for f in files if f.path != MANIFEST_FILE}
    for f in stored.values():
        entry = signed_files.get(f.path)
        if entry is None or (entry.size, entry.sha256) != (f.size, f.sha256):
            raise ManifestError(
                "content_mismatch", f"{f.path} is not the file the bundle's manifest signs"
            )
    missing = sorted(set(signed_files) - set(stored))
    if missing:
        raise ManifestError(
            "content_mismatch",
            f"the bundle's manifest signs {missing[0]}, which the import would not store",
        )
    return {
        "registry": signed.predicate.get("registry"),
        "artifact_id": signed.artifact_id,
        "key_id": signed.key_id,
        "manifest_sha256": hashlib.sha256(data).hexdigest(),
    }
